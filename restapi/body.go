package restapi

import (
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/jsonx"
	"github.com/han-app/gateway/restapi/apierr"
)

// Body limits (413 payload_too_large), enforced while reading: chat endpoints
// take 64 KiB, the project Redis API 16 MiB + 64 KiB on the routes that carry
// a large value (cache PUT, publish; escapes count: the limit is on bytes)
// and projectapi.SmallBodyLimit (64 KiB) on its other routes.
const (
	ChatBodyLimit    = 64 << 10
	ProjectBodyLimit = 16<<20 + 64<<10
)

// readBody reads at most limit bytes. A declared Content-Length over the
// limit is refused before reading anything; a chunked body is cut off by
// http.MaxBytesReader as soon as it passes the limit, so an oversized body
// is never held in memory.
//
// The buffer follows the bytes received, not the length declared: it
// starts at bodyStartBuf at most and doubles as it fills (never past the
// declared length). A client that declares 64 KiB, sends a byte and stalls
// holds 4 KiB of the server's memory until the body deadline, not 64 KiB.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, errPayloadTooLarge
	}
	rd := http.MaxBytesReader(w, r.Body, limit)
	// One byte past the declared length lets the read that meets the end
	// of the body find room and see io.EOF without growing the buffer.
	declared, start := r.ContentLength+1, int64(bodyStartBuf)
	if r.ContentLength < 0 {
		declared, start = limit+1, chunkedStartBuf
	}
	buf := make([]byte, 0, min(declared, start))
	for {
		if len(buf) == cap(buf) {
			grown := make([]byte, len(buf), max(min(2*int64(cap(buf)), declared), int64(cap(buf))+1))
			copy(grown, buf)
			buf = grown
		}
		n, err := rd.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return nil, errPayloadTooLarge
			}
			return nil, bodyReadError(err)
		}
	}
}

// The most readBody allocates before a body's bytes arrive: for a declared
// length, and for a chunked body (mostly small requests of scripts).
const (
	bodyStartBuf    = 4 << 10
	chunkedStartBuf = 512
)

// decodeJSON reads and strictly decodes a JSON object body into v: the raw
// checks (invalid UTF-8, lone surrogates, duplicate keys, which Go's JSON
// decoders would silently repair or let win) run before decoding, and every
// failure is 400 invalid_json.
//
// A member fills a field only under the field's exact name. Go's decoders
// also match names that differ in letter case, so {"body":"a","BODY":"b"}
// would store "b" while every other reader of the same bytes (the sender's
// client, a proxy, a moderation hook) sees "a"; here "BODY" is an unknown
// member and ignored like any other.
func decodeJSON(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	ct := r.Header.Get("Content-Type")
	if !jsonx.MediaTypeOK(ct) {
		return apierr.UnsupportedMediaType
	}
	b, err := readBody(w, r, limit)
	if err != nil {
		return err
	}
	if err := jsonx.DecodeObject(b, v); err != nil {
		return errInvalidJSON
	}
	return nil
}

// writeJSON writes a bare DTO.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, errInternal)
		return
	}
	writeRawJSON(w, status, b)
}

func writeRawJSON(w http.ResponseWriter, status int, b []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
