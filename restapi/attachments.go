package restapi

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
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
	// BlobCallTimeout bounds each file-system call on BlobDir, after which
	// the folder is taken for stalled and the transfer answered 503
	// blob_store_unavailable. Zero value means store.DefaultBlobCallTimeout.
	BlobCallTimeout time.Duration
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
		if cfg.BlobCallTimeout > 0 {
			b.SetCallTimeout(cfg.BlobCallTimeout)
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
	r.HandleFunc("/v1/attachments/{id}/blob", s.handle(s.serveBlob)).Methods(readMethods...)
}

// attachmentRoutes are the user routes, relative to /v1.
func (s *Server) attachmentRoutes(user *mux.Router) {
	s.answersDB0Outage(user.HandleFunc("/attachments", s.handle(s.initAttachment)).Methods(http.MethodPost), limitWithReserve)
	s.answersDB0Outage(user.HandleFunc("/attachments/{id}/download-url", s.handle(s.downloadURL)).Methods(readMethods...), limitFirst)
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
		hasControl(c.Filename) || hasLineSeparator(c.Filename) || hasHiddenChar(c.Filename) ||
		strings.ContainsAny(c.Filename, `/\`) || c.Filename == "." || c.Filename == ".." {
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
	if raw == "" || raw[0] < '1' || raw[0] > '9' || strings.TrimLeft(raw, "0123456789") != "" {
		return c, apiErr(http.StatusBadRequest, "invalid_size")
	}
	// Digits only, without a leading zero: the one error ParseInt can give
	// is a value past 64 bits, which is over any limit too.
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || n > s.att.cfg.MaxBytes {
		return c, errPayloadTooLarge
	}
	c.SizeBytes = n
	return c, nil
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
				return idemResult{}, s.keyAnswers(ctx, target, err)
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
// checks it with one round trip bounded by the Redis budget: what the
// route hands out is guarded by its rate limit, which lives in DB0.
//
// On a Redis Cluster that limit lives on the masters of the request's
// limit keys (limitKeys), and only they are checked: a PING to a master
// picked at random would fail the request because an unrelated master is
// down, or pass it although the limit's master is. With no limit key (no
// family of the route's policy applies, or no Redis limiter runs) the
// request has nothing in DB0 to depend on, so no master's state bears on
// it and only DB0 as a whole is consulted, without a round trip.
func (s *Server) requireDB0(ctx context.Context) error {
	if err := deferredDB0(ctx); err != nil {
		return err
	}
	h := s.idem.health
	if h == nil {
		return rds.ErrRedisUnavailable
	}
	var keys []string
	if d := db0DeferralOf(ctx); d != nil {
		keys = d.limitKeys
	}
	ctx, cancel := context.WithTimeout(ctx, s.idem.cfg.RedisBudget)
	defer cancel()
	if !h.PerMaster() {
		return h.Ping(ctx)
	}
	if err := h.Check(); err != nil {
		return err
	}
	for _, k := range keys {
		if err := h.PingKey(ctx, k); err != nil {
			return err
		}
	}
	return nil
}
