package restapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"hash"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/han-app/gateway/store"
)

// startUpload claims the attachment's one upload in progress on this
// instance, or reports false when another PUT holds it; endUpload gives it
// back. One signed URL would otherwise let a client open any number of
// concurrent uploads of the same attachment, each holding a connection
// (and, once its bytes arrive, an open blob), for one attachment init.
func (a *attachments) startUpload(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.uploading[id] {
		return false
	}
	a.uploading[id] = true
	return true
}

func (a *attachments) endUpload(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.uploading, id)
}

// blobsFull reports whether every open-blob token is taken right now, or
// client has all of its own.
func (a *attachments) blobsFull(client string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.open) == cap(a.open) || a.openBy[client] >= a.cfg.MaxOpenBlobsPerClient
}

// openBlob takes a token for one open blob of client, or reports false
// when MaxOpenBlobs are open or MaxOpenBlobsPerClient of client's;
// closeBlob gives it back.
func (a *attachments) openBlob(client string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.openBy[client] >= a.cfg.MaxOpenBlobsPerClient {
		return false
	}
	select {
	case a.open <- struct{}{}:
		a.openBy[client]++
		return true
	default:
		return false
	}
}

func (a *attachments) closeBlob(client string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.openBy[client]--; a.openBy[client] <= 0 {
		delete(a.openBy, client)
	}
	<-a.open
}

// blobClient is the client address r's open blobs count against: the
// client's address (an IPv6 client's /64), through trusted proxies.
func (s *Server) blobClient(r *http.Request) string {
	if a := s.ClientAddr(r); a.IsValid() {
		return clientNet(a)
	}
	return r.RemoteAddr
}

// uploadBlob: PUT to the signed upload URL. No bearer token: the signature
// is the authorization. The body limit is the declared size (413 beyond it,
// enforced while reading), the Content-Type must be the declared one.
func (s *Server) uploadBlob(w http.ResponseWriter, r *http.Request) error {
	id, err := s.att.verify(r, http.MethodPut)
	if err != nil {
		return err
	}
	a, err := s.store.GetAttachment(r.Context(), id)
	if err != nil {
		return err
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != a.ContentType {
		return errUnsupportedMedia
	}
	if r.ContentLength > a.SizeBytes {
		return errPayloadTooLarge
	}
	if !s.att.startUpload(a.ID) {
		return errUploadInProgress
	}
	defer s.att.endUpload(a.ID)
	if a.Status == store.AttachmentUploaded {
		return s.uploadAgain(w, r, a)
	}
	// Refused before the body is asked for (Expect: 100-continue) when
	// every slot is taken already.
	client := s.blobClient(r)
	if s.att.blobsFull(client) {
		return errBlobsBusy
	}
	h := sha256.New()
	body := &hashingReader{r: http.MaxBytesReader(w, r.Body, a.SizeBytes), h: h}
	// The blob's slot is taken once the body's first bytes are here: a
	// client that sends headers and then nothing holds its connection
	// until the body deadline cuts it off, but no slot of the uploads and
	// downloads of everybody else.
	first, err := firstBytes(body)
	if err == io.EOF && len(first) == 0 {
		return errUploadSize
	}
	if err != nil && err != io.EOF {
		return uploadReadError(err, body)
	}
	if !s.att.openBlob(client) {
		return errBlobsBusy
	}
	defer s.att.closeBlob(client)
	key := blobKey(a.ID)
	n, err := s.att.blobs.Put(r.Context(), key, io.MultiReader(bytes.NewReader(first), body))
	if err != nil {
		return uploadReadError(err, body)
	}
	if n != a.SizeBytes {
		_ = s.att.blobs.Delete(context.WithoutCancel(r.Context()), key)
		return errUploadSize
	}
	sum := hex.EncodeToString(h.Sum(nil))
	cur, err := s.store.MarkAttachmentUploaded(r.Context(), a.ID, key, sum)
	if errors.Is(err, store.ErrAttachmentUploaded) {
		// An earlier or concurrent upload won. The same bytes again is a
		// retry (200); other bytes may not replace what a message may
		// already show.
		_ = s.att.blobs.Delete(context.WithoutCancel(r.Context()), key)
		if cur.SHA256 != sum {
			return err
		}
		err = nil
	}
	if err != nil {
		// A write PostgreSQL may have committed (its answer was lost) may
		// have named this blob: it stays, and if the row does not name it
		// the janitor's orphan sweep deletes it later. Only a write known
		// to have changed nothing lets the blob go now.
		if !errors.Is(err, store.ErrUploadOutcomeUnknown) {
			_ = s.att.blobs.Delete(context.WithoutCancel(r.Context()), key)
		}
		return err
	}
	writeJSON(w, http.StatusOK, AttachmentDTO{ID: cur.ID, Filename: cur.Filename, ContentType: cur.ContentType, SizeBytes: cur.SizeBytes})
	return nil
}

// uploadAgain answers a PUT to an attachment that is uploaded already:
// the retry of an upload whose answer was lost, most often. It is judged
// by the body alone, hashed as it arrives and never stored: the same bytes
// are 200 with the attachment, other bytes of the declared size 409
// attachment_already_uploaded, a body of another size 400 or 413 as for a
// first upload. Writing the body to the blob store only to delete it
// again would make a retry after the upload that took the disk's last
// space (or while the folder is broken) fail 507 or 503, and its client
// give up on an attachment it can send, and would cost a blob slot and a
// synced file per retry for nothing.
func (s *Server) uploadAgain(w http.ResponseWriter, r *http.Request, a store.Attachment) error {
	h := sha256.New()
	body := &hashingReader{r: http.MaxBytesReader(w, r.Body, a.SizeBytes), h: h}
	n, err := io.Copy(io.Discard, body)
	if err != nil {
		return uploadReadError(err, body)
	}
	if n != a.SizeBytes {
		return errUploadSize
	}
	if hex.EncodeToString(h.Sum(nil)) != a.SHA256 {
		return store.ErrAttachmentUploaded
	}
	writeJSON(w, http.StatusOK, AttachmentDTO{ID: a.ID, Filename: a.Filename, ContentType: a.ContentType, SizeBytes: a.SizeBytes})
	return nil
}

// firstBytes reads the first bytes of an upload's body: at least one, or
// the error that ended the body before any.
func firstBytes(r io.Reader) ([]byte, error) {
	buf := make([]byte, 32<<10)
	for range 100 {
		n, err := r.Read(buf)
		if n > 0 || err != nil {
			return buf[:n], err
		}
	}
	return nil, io.ErrNoProgress
}

// uploadReadError maps the failure of reading and storing an upload's
// body: past the declared size, the client's body (its deadline, a broken
// stream, the client gone), or else the blob store's own failure, which
// the error table answers.
func uploadReadError(err error, body *hashingReader) error {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return errPayloadTooLarge
	case body.readErr != nil:
		return bodyReadError(body.readErr)
	case errors.Is(err, context.Canceled):
		return apiErr(http.StatusBadRequest, "invalid_body_stream")
	default:
		return err
	}
}

// blobKey names one upload's blob: a random shard, the attachment id and a
// random suffix, so concurrent uploads never overwrite each other. The
// janitor's orphan sweep reads the attachment id from it (store.BlobLister).
func blobKey(id string) string {
	t := randomToken()
	return t[:2] + "/" + id + "-" + t[2:]
}

type hashingReader struct {
	r       io.Reader
	h       hash.Hash
	readErr error
}

func (hr *hashingReader) Read(p []byte) (int, error) {
	n, err := hr.r.Read(p)
	hr.h.Write(p[:n])
	if err != nil && err != io.EOF {
		var mbe *http.MaxBytesError
		if !errors.As(err, &mbe) {
			hr.readErr = err
		}
	}
	return n, err
}

// serveBlob: GET/HEAD of the signed download URL.
func (s *Server) serveBlob(w http.ResponseWriter, r *http.Request) error {
	id, err := s.att.verify(r, http.MethodGet)
	if err != nil {
		return err
	}
	a, err := s.store.GetAttachment(r.Context(), id)
	if err == nil && a.Status != store.AttachmentUploaded {
		err = store.ErrAttachmentNotFound
	}
	if err != nil {
		return err
	}
	client := s.blobClient(r)
	if !s.att.openBlob(client) {
		return errBlobsBusy
	}
	defer s.att.closeBlob(client)
	f, err := s.att.blobs.Open(r.Context(), a.BlobKey)
	if errors.Is(err, store.ErrBlobNotFound) {
		err = store.ErrAttachmentNotFound
	}
	if err != nil {
		return err
	}
	defer f.Close()
	h := w.Header()
	h.Set("Content-Type", a.ContentType)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "default-src 'none'; sandbox")
	h.Set("Content-Disposition", contentDisposition(a.Filename))
	h.Set("Cache-Control", "private, no-store")
	if rng, ok := withoutEmptySuffixes(r.Header.Get("Range")); !ok {
		h.Del("Content-Disposition")
		h.Set("Content-Range", "bytes */"+strconv.FormatInt(a.SizeBytes, 10))
		return errRangeNotSatisfiable
	} else if rng != r.Header.Get("Range") {
		r = r.Clone(r.Context())
		r.Header.Set("Range", rng)
	}
	cw := &contentWriter{ResponseWriter: w}
	http.ServeContent(cw, r, "", time.Time{}, f)
	if cw.failed == 0 {
		return nil
	}
	h.Del("Content-Disposition") // the error answer is no file to save
	switch cw.failed {
	case http.StatusRequestedRangeNotSatisfiable:
		return errRangeNotSatisfiable // with ServeContent's Content-Range: bytes */<size>
	case http.StatusPreconditionFailed:
		return errPreconditionFailed
	}
	return errBlobUnreadable
}

// withoutEmptySuffixes drops the suffix ranges of length zero ("-0") from
// a Range header: they select no byte and are unsatisfiable (RFC 9110),
// but net/http serves one as a 206 with the impossible Content-Range
// "bytes <size>-<size-1>/<size>". ok is false when nothing else is left,
// which is 416. A header that is not a byte-range set is returned as it
// is, for ServeContent to judge.
func withoutEmptySuffixes(h string) (string, bool) {
	specs, found := strings.CutPrefix(h, "bytes=")
	if !found {
		return h, true
	}
	var kept []string
	dropped := false
	for spec := range strings.SplitSeq(specs, ",") {
		if t := strings.TrimSpace(spec); strings.HasPrefix(t, "-") && strings.TrimLeft(t[1:], "0") == "" && len(t) > 1 {
			dropped = true
			continue
		}
		kept = append(kept, spec)
	}
	switch {
	case !dropped:
		return h, true
	case len(kept) == 0:
		return "", false
	}
	return "bytes=" + strings.Join(kept, ","), true
}

// contentDisposition makes the download a file named like the attachment:
// filename* carries the name in UTF-8 with every byte outside RFC 8187's
// attr-char percent-encoded (a parser may drop a parameter holding any
// other character, and the browser then saves the file without its name),
// and filename, for clients that do not read filename*, an ASCII
// approximation: other characters, '"' and '\' become '_'.
func contentDisposition(name string) string {
	var b strings.Builder
	b.WriteString(`attachment; filename="`)
	for _, r := range name {
		if r < 0x20 || r > 0x7e || r == '"' || r == '\\' {
			r = '_'
		}
		b.WriteRune(r)
	}
	b.WriteString(`"; filename*=UTF-8''`)
	const hexDigits = "0123456789ABCDEF"
	for i := 0; i < len(name); i++ {
		if c := name[i]; isAttrChar(c) {
			b.WriteByte(c)
		} else {
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&0xf])
		}
	}
	return b.String()
}

// isAttrChar reports whether c is an RFC 8187 attr-char: ALPHA / DIGIT /
// "!" / "#" / "$" / "&" / "+" / "-" / "." / "^" / "_" / "`" / "|" / "~".
func isAttrChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		strings.IndexByte("!#$&+-.^_`|~", c) >= 0
}

// contentWriter is the ResponseWriter of http.ServeContent in serveBlob.
// ServeContent answers some requests itself: 206 for a Range, 304 for a
// matching If-None-Match, and errors (412, 416, 500) with a plain-text or
// empty body. Everything below 400 passes through; an error status is
// recorded in failed and nothing of it is written, so serveBlob returns
// the error and fail answers it as JSON, like every other error.
type contentWriter struct {
	http.ResponseWriter
	failed int // the error status ServeContent chose; 0: none
}

func (w *contentWriter) WriteHeader(code int) {
	if code >= 400 && w.failed == 0 {
		w.failed = code
	}
	if w.failed == 0 {
		w.ResponseWriter.WriteHeader(code)
	}
}

func (w *contentWriter) Write(b []byte) (int, error) {
	if w.failed != 0 {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *contentWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
