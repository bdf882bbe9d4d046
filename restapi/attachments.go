package restapi

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"hash"
	"io"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gorilla/mux"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/restapi/apierr"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

// AttachmentConfig tunes attachments (docs/idempotency.md).
type AttachmentConfig struct {
	// MaxBytes is the largest declared size. Zero value means 25 MiB.
	MaxBytes int64
	// ContentTypes is the allow-list of media types (lower case, no
	// parameters). Zero value means DefaultAttachmentTypes.
	ContentTypes []string
	// UploadURLTTL is the signed upload URL's lifetime. Zero value means 15m.
	UploadURLTTL time.Duration
	// DownloadURLTTL is the signed download URL's lifetime. Zero value
	// means 5m.
	DownloadURLTTL time.Duration
	// BlobDir is the local blob folder used when Deps.Blobs is nil. Zero
	// value means <os temp dir>/han-blobs.
	BlobDir string
	// MaxOpenBlobs bounds the uploads and downloads whose blob is open at
	// once (each holds a file descriptor beside its connection's). Zero
	// value means DefaultMaxOpenBlobs.
	MaxOpenBlobs int
	// MaxOpenBlobsPerClient bounds the open blobs of one client address
	// (an IPv6 client's /64), so one client cannot take every slot: a few
	// downloads that never read would refuse everyone's transfers. Zero
	// value means an eighth of MaxOpenBlobs (at least 1).
	MaxOpenBlobsPerClient int
}

// DefaultMaxOpenBlobs is half of the descriptors the gateway keeps free
// under its default connection cap for what is not a client connection.
// Without a bound, clients downloading slowly near the connection cap would
// each hold a second descriptor, and the process would run out: accepts,
// database dials and log writes would fail for everyone.
const DefaultMaxOpenBlobs = 128

// DefaultAttachmentTypes is the default content-type allow-list: common
// images, audio, video and documents; nothing a browser would run (no HTML,
// SVG or JavaScript).
var DefaultAttachmentTypes = []string{
	"image/jpeg", "image/png", "image/gif", "image/webp", "image/heic",
	"audio/mpeg", "audio/ogg", "audio/mp4", "audio/webm",
	"video/mp4", "video/webm", "video/quicktime",
	"application/pdf", "application/zip", "text/plain",
}

// Attachment limits.
const (
	DefaultAttachmentMaxBytes = 25 << 20
	MaxFilenameBytes          = 255
)

var (
	errInvalidSignature  = apiErr(http.StatusForbidden, "invalid_signature")
	errURLExpired        = apiErr(http.StatusForbidden, "url_expired")
	errInvalidAttachment = apiErr(http.StatusBadRequest, "invalid_attachment")
	errUploadSize        = apiErr(http.StatusBadRequest, "upload_size_mismatch")
	errUnsupportedMedia  = apiErr(http.StatusUnsupportedMediaType, "unsupported_media_type")
	errInvalidUUID       = apiErr(http.StatusBadRequest, "invalid_uuid")
	// errBlobsBusy: MaxOpenBlobs uploads and downloads are under way.
	errBlobsBusy = apierr.NewRetry(http.StatusServiceUnavailable, "attachments_busy", 1)
	// errUploadInProgress: another PUT of the same attachment is being
	// read on this instance. It ends within the body deadline when its
	// client stalls, so a retry shortly after succeeds.
	errUploadInProgress = apierr.NewRetry(http.StatusConflict, "upload_in_progress", 1)
	errInvalidFilename  = apiErr(http.StatusBadRequest, "invalid_filename")
	// The signed download's answers to a Range the blob cannot satisfy and
	// to a precondition (If-Match, If-Unmodified-Since) that does not hold.
	errRangeNotSatisfiable = apiErr(http.StatusRequestedRangeNotSatisfiable, "range_not_satisfiable")
	errPreconditionFailed  = apiErr(http.StatusPreconditionFailed, "precondition_failed")
	// errBlobUnreadable: the blob store's file could not be read as a
	// whole (its size or a seek failed).
	errBlobUnreadable = rds.Named("blob_unreadable", "restapi: blob could not be read")
)

// attachments holds the attachment settings and the blob store.
type attachments struct {
	cfg     AttachmentConfig
	types   map[string]bool
	blobs   store.BlobStore
	signKey []byte        // HMAC key of signed URLs, derived from HAN_HMAC_SECRET
	open    chan struct{} // one token per blob open (MaxOpenBlobs)

	mu        sync.Mutex
	uploading map[string]bool // guarded by mu: attachments with a PUT in progress here
	openBy    map[string]int  // guarded by mu: open blobs by client address (blobClient)
}

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

func (s *Server) initAttachments(d Deps) error {
	cfg := d.Config.Attachments
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultAttachmentMaxBytes
	}
	if len(cfg.ContentTypes) == 0 {
		cfg.ContentTypes = DefaultAttachmentTypes
	}
	if cfg.UploadURLTTL <= 0 {
		cfg.UploadURLTTL = 15 * time.Minute
	}
	if cfg.DownloadURLTTL <= 0 {
		cfg.DownloadURLTTL = 5 * time.Minute
	}
	if cfg.MaxOpenBlobs <= 0 {
		cfg.MaxOpenBlobs = DefaultMaxOpenBlobs
	}
	if cfg.MaxOpenBlobsPerClient <= 0 {
		cfg.MaxOpenBlobsPerClient = max(cfg.MaxOpenBlobs/8, 1)
	}
	a := &attachments{cfg: cfg, types: map[string]bool{}, blobs: d.Blobs, open: make(chan struct{}, cfg.MaxOpenBlobs),
		uploading: map[string]bool{}, openBy: map[string]int{}}
	for _, t := range cfg.ContentTypes {
		a.types[strings.ToLower(strings.TrimSpace(t))] = true
	}
	if a.blobs == nil {
		dir := cfg.BlobDir
		if dir == "" {
			dir = filepath.Join(os.TempDir(), "han-blobs")
		}
		b, err := store.NewLocalBlobs(dir)
		if err != nil {
			return err
		}
		a.blobs = b
	}
	m := hmac.New(sha256.New, s.hmacSecret)
	m.Write([]byte("han attachment urls v1"))
	a.signKey = m.Sum(nil)
	s.att = a
	return nil
}

// Blobs is the blob store attachments are kept in (Deps.Blobs, or the
// local folder made from Config.Attachments.BlobDir), for the janitor that
// deletes the blobs of purged attachments and orphan blobs.
func (s *Server) Blobs() store.BlobStore { return s.att.blobs }

// attachmentBlobRoutes are the signed routes (no bearer token); they are
// registered on the root router before the /v1 user subrouter.
func (s *Server) attachmentBlobRoutes(r *mux.Router) {
	r.HandleFunc("/v1/attachments/{id}/blob", s.handle(s.uploadBlob)).Methods(http.MethodPut)
	r.HandleFunc("/v1/attachments/{id}/blob", s.handle(s.serveBlob)).Methods(http.MethodGet, http.MethodHead)
}

// attachmentRoutes are the user routes, relative to /v1.
func (s *Server) attachmentRoutes(user *mux.Router) {
	s.answersDB0Outage(user.HandleFunc("/attachments", s.handle(s.initAttachment)).Methods(http.MethodPost), limitWithReserve)
	s.answersDB0Outage(user.HandleFunc("/attachments/{id}/download-url", s.handle(s.downloadURL)).Methods(http.MethodGet), limitFirst)
}

// AttachmentDTO is an attachment as a message carries it.
type AttachmentDTO = pubsub.Attachment

type uploadDTO struct {
	ID        string `json:"id"`
	UploadURL string `json:"uploadUrl"`
	ExpiresAt int64  `json:"expiresAt"`
}

type downloadDTO struct {
	URL       string `json:"url"`
	ExpiresAt int64  `json:"expiresAt"`
}

// signature is base64url(HMAC(signKey, purpose, id, expiry)). The purpose
// is the HTTP method the URL is for, so an upload URL cannot download and a
// download URL cannot upload.
func (a *attachments) signature(method, id string, expiresMs int64) string {
	m := hmac.New(sha256.New, a.signKey)
	m.Write([]byte(method + "\n" + id + "\n" + strconv.FormatInt(expiresMs, 10)))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// signedURL is deterministic: the same attachment and expiry give the same
// URL, which is how an idempotent replay re-creates the first response
// without any URL being stored. It is relative to the API's origin.
func (a *attachments) signedURL(method, id string, expiresMs int64) string {
	return "/v1/attachments/" + id + "/blob?expires=" + strconv.FormatInt(expiresMs, 10) +
		"&sig=" + a.signature(method, id, expiresMs)
}

// verify checks a signed URL for method: 403 invalid_signature, then 403
// url_expired.
func (a *attachments) verify(r *http.Request, method string) (string, error) {
	id := mux.Vars(r)["id"]
	q := r.URL.Query()
	exp, err := strconv.ParseInt(q.Get("expires"), 10, 64)
	if err != nil || !ids.Valid(id) {
		return "", errInvalidSignature
	}
	want := a.signature(method, id, exp)
	if subtle.ConstantTimeCompare([]byte(want), []byte(q.Get("sig"))) != 1 {
		return "", errInvalidSignature
	}
	if time.Now().UnixMilli() > exp {
		return "", errURLExpired
	}
	return id, nil
}

type initAttachmentReq struct {
	DialogID    *string         `json:"dialogId"`
	Filename    *string         `json:"filename"`
	ContentType *string         `json:"contentType"`
	SizeBytes   json.RawMessage `json:"sizeBytes"`
}

// canonicalInit is the validated request, re-encoded for the fingerprint.
type canonicalInit struct {
	DialogID    string `json:"dialogId"`
	Filename    string `json:"filename"`
	ContentType string `json:"contentType"`
	SizeBytes   int64  `json:"sizeBytes"`
}

func (s *Server) validateInit(req initAttachmentReq) (canonicalInit, error) {
	var c canonicalInit
	if req.DialogID == nil {
		return c, errInvalidUUID
	}
	id, ok := ids.Canonical(*req.DialogID)
	if !ok {
		return c, errInvalidUUID
	}
	c.DialogID = id
	if req.Filename == nil {
		return c, errInvalidFilename
	}
	c.Filename = strings.TrimSpace(*req.Filename)
	if c.Filename == "" || len(c.Filename) > MaxFilenameBytes || !utf8.ValidString(c.Filename) ||
		hasControl(c.Filename) || hasFormat(c.Filename) || strings.ContainsAny(c.Filename, `/\`) ||
		c.Filename == "." || c.Filename == ".." {
		return c, errInvalidFilename
	}
	if req.ContentType == nil {
		return c, apiErr(http.StatusBadRequest, "invalid_content_type")
	}
	mt, _, err := mime.ParseMediaType(*req.ContentType)
	if err != nil || !s.att.types[mt] {
		return c, apiErr(http.StatusBadRequest, "invalid_content_type")
	}
	c.ContentType = mt
	// sizeBytes: a plain positive integer (no sign, fraction or exponent).
	raw := string(req.SizeBytes)
	if raw == "" || raw[0] < '1' || raw[0] > '9' || len(raw) > 19 || strings.TrimLeft(raw, "0123456789") != "" {
		return c, apiErr(http.StatusBadRequest, "invalid_size")
	}
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		return c, apiErr(http.StatusBadRequest, "invalid_size")
	}
	if n > s.att.cfg.MaxBytes {
		return c, errPayloadTooLarge
	}
	c.SizeBytes = n
	return c, nil
}

// hasFormat reports whether s holds a Unicode format character (category
// Cf): bidirectional overrides and isolates, zero-width characters, the
// byte order mark. They are invisible, and the bidi ones reorder what
// follows, so "invoice\u202Efdp.exe" shows as "invoiceexe.pdf" wherever
// the name is displayed: a file could pose as another type.
func hasFormat(s string) bool {
	for _, r := range s {
		if unicode.Is(unicode.Cf, r) {
			return true
		}
	}
	return false
}

// initAttachment: POST /v1/attachments (Idempotency-Key required) → 201
// {id, uploadUrl, expiresAt}.
func (s *Server) initAttachment(w http.ResponseWriter, r *http.Request) error {
	if _, _, err := idemKeyHeader(r); err != nil {
		return err
	}
	var req initAttachmentReq
	if err := decodeJSON(w, r, ChatBodyLimit, &req); err != nil {
		return err
	}
	c, err := s.validateInit(req)
	if err != nil {
		return err
	}
	canon, _ := json.Marshal(c)
	me := principal(r).UserID
	s.serveIdempotent(w, r, idemOp{
		scope: scopeAttachmentInit, required: true, canon: canon,
		exec: func(ctx context.Context, target *idemTarget) (idemResult, error) {
			in := store.CreateAttachment{ID: ids.New(), DialogID: c.DialogID, UploaderID: me, Filename: c.Filename,
				ContentType: c.ContentType, SizeBytes: c.SizeBytes, UploadTTL: s.att.cfg.UploadURLTTL,
				Idem: idemWrite(target, uploadRecord)}
			a, err := s.store.CreateAttachment(ctx, in)
			if err != nil {
				return idemResult{}, err
			}
			rec := uploadRecord(a)
			body, err := json.Marshal(s.uploadDTO(a.ID, a.UploadExpiresAt.UnixMilli()))
			return idemResult{rec: rec, body: body}, err
		},
		render: func(ctx context.Context, rec store.IdemRecord) ([]byte, error) {
			var meta uploadMeta
			if err := json.Unmarshal([]byte(rec.Meta), &meta); err != nil || meta.UploadExpiresAt == 0 {
				return nil, errors.New("restapi: idempotency record without upload expiry")
			}
			// The resource must still exist; its URL is re-signed from the
			// stored expiry, so a late replay returns the same, expired URL.
			if _, err := s.store.GetAttachment(ctx, rec.ResourceID); err != nil {
				return nil, err
			}
			return json.Marshal(s.uploadDTO(rec.ResourceID, meta.UploadExpiresAt))
		},
	})
	return nil
}

// uploadMeta is the idempotency record's meta of an attachment init: what
// re-signing the upload URL needs, never the URL.
type uploadMeta struct {
	UploadExpiresAt int64 `json:"uploadExpiresAt"`
}

func uploadRecord(a store.Attachment) store.IdemRecord {
	meta, _ := json.Marshal(uploadMeta{UploadExpiresAt: a.UploadExpiresAt.UnixMilli()})
	return store.IdemRecord{Status: http.StatusCreated, ResourceID: a.ID, Meta: string(meta)}
}

func (s *Server) uploadDTO(id string, expiresMs int64) uploadDTO {
	return uploadDTO{ID: id, UploadURL: s.att.signedURL(http.MethodPut, id, expiresMs), ExpiresAt: expiresMs}
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

// downloadURL: GET /v1/attachments/{id}/download-url → {url, expiresAt} for
// members of the attachment's dialog. It fails closed while DB0 is
// unreachable (docs/degraded-mode.md: a signed URL is handed out only where
// its limit can be applied).
func (s *Server) downloadURL(w http.ResponseWriter, r *http.Request) error {
	id, err := pathUUID(r, "id")
	if err != nil {
		return err
	}
	if err := s.requireDB0(r.Context()); err != nil {
		return err
	}
	a, err := s.store.AttachmentForMember(r.Context(), id, principal(r).UserID)
	if err != nil {
		return err
	}
	if a.Status != store.AttachmentUploaded {
		return store.ErrAttachmentNotUploaded
	}
	exp := time.Now().Add(s.att.cfg.DownloadURLTTL).UnixMilli()
	writeJSON(w, http.StatusOK, downloadDTO{URL: s.att.signedURL(http.MethodGet, a.ID, exp), ExpiresAt: exp})
	return nil
}

// requireDB0 fails at once while DB0 is known to be down, and otherwise
// checks it with one round trip bounded by the Redis budget.
func (s *Server) requireDB0(ctx context.Context) error {
	if err := deferredDB0(ctx); err != nil {
		return err
	}
	if s.idem.health == nil {
		return rds.ErrRedisUnavailable
	}
	ctx, cancel := context.WithTimeout(ctx, s.idem.cfg.RedisBudget)
	defer cancel()
	return s.idem.health.Ping(ctx)
}
