package restapi_test

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/restapi"
)

type uploadResp struct {
	ID        string `json:"id"`
	UploadURL string `json:"uploadUrl"`
	ExpiresAt int64  `json:"expiresAt"`
}

type downloadResp struct {
	URL       string `json:"url"`
	ExpiresAt int64  `json:"expiresAt"`
}

// downloadURL asks for the signed download URL of attachment id as tok's
// user, which must get one.
func (h *harness) downloadURL(tok, id string) downloadResp {
	h.t.Helper()
	code, b := h.do(tok, "GET", "/v1/attachments/"+id+"/download-url", "")
	if code != 200 {
		h.t.Fatalf("download url: %d %s", code, b)
	}
	return decode[downloadResp](h.t, b)
}

type attachmentResp struct {
	ID          string `json:"id"`
	Filename    string `json:"filename"`
	ContentType string `json:"contentType"`
	SizeBytes   int64  `json:"sizeBytes"`
}

type messageWithAttachments struct {
	ID          string           `json:"id"`
	Attachments []attachmentResp `json:"attachments"`
}

// put sends body to a signed URL without any bearer token.
func (h *harness) put(signed, contentType, body string) (int, []byte) {
	h.t.Helper()
	req, err := http.NewRequest("PUT", h.srv.URL+signed, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func (h *harness) get(signed string) (*http.Response, []byte) {
	h.t.Helper()
	resp, err := http.Get(h.srv.URL + signed)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func initBody(dialogID, filename, ct string, size any) string {
	return fmt.Sprintf(`{"dialogId":%q,"filename":%q,"contentType":%q,"sizeBytes":%v}`, dialogID, filename, ct, size)
}

func TestAttachmentFlow(t *testing.T) {
	h := newIdemHarness(t, idemOpts{})
	alice, aTok := h.user()
	bob, bTok := h.user()
	_, cTok := h.user()
	d := h.dialog(aTok, bob)
	content := "%PDF-1.4 report " + ids.New()

	body := initBody(d.ID, "report – Q1.pdf", "application/pdf", len(content))
	code, b1, _ := h.doH(aTok, "POST", "/v1/attachments", body, keyHdr("att-1"))
	if code != 201 {
		t.Fatalf("init: %d %s", code, b1)
	}
	u := decode[uploadResp](t, b1)
	if !ids.Valid(u.ID) || !strings.HasPrefix(u.UploadURL, "/v1/attachments/"+u.ID+"/blob?") {
		t.Fatalf("init DTO: %s", b1)
	}
	if left := time.Until(time.UnixMilli(u.ExpiresAt)); left < 14*time.Minute || left > 15*time.Minute+time.Second {
		t.Fatalf("upload URL lifetime: %v, want 15 min", left)
	}
	// Replay: byte-identical, URL re-signed, nothing stored but the expiry.
	code, b2, hdr := h.doH(aTok, "POST", "/v1/attachments", body, keyHdr("att-1"))
	if code != 201 || !bytes.Equal(b1, b2) || hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("init replay: %d %s, want %s", code, b2, b1)
	}
	code, b, _ := h.doH(aTok, "POST", "/v1/attachments", initBody(d.ID, "other.pdf", "application/pdf", len(content)), keyHdr("att-1"))
	wantError(t, code, b, 409, "idempotency_key_reused")
	sig := u.UploadURL[strings.Index(u.UploadURL, "sig=")+4:]
	for _, where := range []string{redisDump(t, env.Redis), h.pgIdemRows(alice)} {
		if strings.Contains(where, sig) || strings.Contains(where, "/blob") || strings.Contains(where, "report") {
			t.Fatalf("an idempotency record holds the signed URL or the filename:\n%s", where)
		}
	}

	// Upload: no bearer token; checks before reading the body.
	q, _ := url.Parse(u.UploadURL)
	tampered := q.Path + "?expires=" + q.Query().Get("expires") + "&sig=" + strings.Repeat("A", len(sig))
	code, b = h.put(tampered, "application/pdf", content)
	wantError(t, code, b, 403, "invalid_signature")
	later := q.Path + "?expires=" + fmt.Sprint(u.ExpiresAt+1000) + "&sig=" + sig
	code, b = h.put(later, "application/pdf", content)
	wantError(t, code, b, 403, "invalid_signature")
	code, b = h.put(u.UploadURL, "text/plain", content)
	wantError(t, code, b, 415, "unsupported_media_type")
	code, b = h.put(u.UploadURL, "application/pdf", content+"x")
	wantError(t, code, b, 413, "payload_too_large")
	code, b = h.put(u.UploadURL, "application/pdf", content[:5])
	wantError(t, code, b, 400, "upload_size_mismatch")
	// Before the upload, the download URL is a conflict.
	code, b = h.do(aTok, "GET", "/v1/attachments/"+u.ID+"/download-url", "")
	wantError(t, code, b, 409, "attachment_not_uploaded")

	code, b = h.put(u.UploadURL, "application/pdf", content)
	if code != 200 {
		t.Fatalf("upload: %d %s", code, b)
	}
	up := decode[attachmentResp](t, b)
	if up.ID != u.ID || up.Filename != "report – Q1.pdf" || up.ContentType != "application/pdf" || up.SizeBytes != int64(len(content)) {
		t.Fatalf("upload answer: %s", b)
	}
	// The same bytes again is a retry; other bytes may not replace them.
	if code, b := h.put(u.UploadURL, "application/pdf", content); code != 200 {
		t.Fatalf("repeated upload: %d %s", code, b)
	}
	code, b = h.put(u.UploadURL, "application/pdf", strings.Repeat("z", len(content)))
	wantError(t, code, b, 409, "attachment_already_uploaded")

	// Download URL: members only, short-lived, signed for GET only.
	code, b = h.do(cTok, "GET", "/v1/attachments/"+u.ID+"/download-url", "")
	wantError(t, code, b, 404, "attachment_not_found")
	code, b = h.do(bTok, "GET", "/v1/attachments/"+ids.New()+"/download-url", "")
	wantError(t, code, b, 404, "attachment_not_found")
	code, b = h.do(bTok, "GET", "/v1/attachments/"+u.ID+"/download-url", "")
	if code != 200 {
		t.Fatalf("download url: %d %s", code, b)
	}
	dl := decode[downloadResp](t, b)
	if left := time.Until(time.UnixMilli(dl.ExpiresAt)); left <= 0 || left > 5*time.Minute+time.Second {
		t.Fatalf("download URL lifetime: %v", left)
	}
	resp, got := h.get(dl.URL)
	if resp.StatusCode != 200 || string(got) != content || resp.Header.Get("Content-Type") != "application/pdf" ||
		resp.Header.Get("X-Content-Type-Options") != "nosniff" || !strings.HasPrefix(resp.Header.Get("Content-Disposition"), "attachment;") {
		t.Fatalf("download: %d %q %v", resp.StatusCode, got, resp.Header)
	}
	code, b = h.put(dl.URL, "application/pdf", content)
	wantError(t, code, b, 403, "invalid_signature")
	resp, b = h.get(u.UploadURL)
	wantError(t, resp.StatusCode, b, 403, "invalid_signature")

	// A message links it; the DTO and history carry it, in order.
	second := h.uploadedAttachment(aTok, d.ID)
	code, mb, _ := h.doH(aTok, "POST", "/v1/dialogs/"+d.ID+"/messages",
		fmt.Sprintf(`{"body":"see attached","attachmentIds":[%q,%q]}`, second.ID, u.ID), idemKey())
	if code != 201 {
		t.Fatalf("send with attachments: %d %s", code, mb)
	}
	m := decode[messageWithAttachments](t, mb)
	if len(m.Attachments) != 2 || m.Attachments[0].ID != second.ID || m.Attachments[1].ID != u.ID ||
		m.Attachments[1].Filename != "report – Q1.pdf" || m.Attachments[1].SizeBytes != int64(len(content)) {
		t.Fatalf("message attachments: %s", mb)
	}
	_, hb := h.do(bTok, "GET", "/v1/dialogs/"+d.ID+"/messages", "")
	if !strings.Contains(string(hb), string(mb)) {
		t.Fatalf("history does not carry the same message DTO:\n%s\n%s", hb, mb)
	}
}

func TestAttachmentValidation(t *testing.T) {
	const max = 1 << 20
	h := newIdemHarness(t, idemOpts{att: restapi.AttachmentConfig{MaxBytes: max}})
	_, aTok := h.user()
	bob, bTok := h.user()
	carol, cTok := h.user()
	d := h.dialog(aTok, bob)
	other := h.dialog(bTok, carol)
	cases := []struct {
		name, body string
		tok        string
		status     int
		code       string
	}{
		{"html not allowed", initBody(d.ID, "x.html", "text/html", 5), aTok, 400, "invalid_content_type"},
		{"svg not allowed", initBody(d.ID, "x.svg", "image/svg+xml", 5), aTok, 400, "invalid_content_type"},
		{"empty filename", initBody(d.ID, " ", "text/plain", 5), aTok, 400, "invalid_filename"},
		{"path in filename", initBody(d.ID, "../etc/passwd", "text/plain", 5), aTok, 400, "invalid_filename"},
		{"control in filename", fmt.Sprintf(`{"dialogId":%q,"filename":"a\u0007.txt","contentType":"text/plain","sizeBytes":5}`, d.ID), aTok, 400, "invalid_filename"},
		{"long filename", initBody(d.ID, strings.Repeat("f", 256), "text/plain", 5), aTok, 400, "invalid_filename"},
		{"size zero", initBody(d.ID, "a.txt", "text/plain", 0), aTok, 400, "invalid_size"},
		{"size negative", initBody(d.ID, "a.txt", "text/plain", -1), aTok, 400, "invalid_size"},
		{"size fraction", initBody(d.ID, "a.txt", "text/plain", 1.5), aTok, 400, "invalid_size"},
		{"size exponent", initBody(d.ID, "a.txt", "text/plain", "1e3"), aTok, 400, "invalid_size"},
		{"size string", initBody(d.ID, "a.txt", "text/plain", `"5"`), aTok, 400, "invalid_size"},
		{"size over the limit", initBody(d.ID, "a.txt", "text/plain", max+1), aTok, 413, "payload_too_large"},
		// Every plain positive integer over the limit is too large, also
		// one past 64 bits.
		{"size of int64 max", initBody(d.ID, "a.txt", "text/plain", "9223372036854775807"), aTok, 413, "payload_too_large"},
		{"size of 19 digits past int64", initBody(d.ID, "a.txt", "text/plain", "9223372036854775808"), aTok, 413, "payload_too_large"},
		{"size of 20 digits", initBody(d.ID, "a.txt", "text/plain", "10000000000000000000"), aTok, 413, "payload_too_large"},
		{"size of 400 digits", initBody(d.ID, "a.txt", "text/plain", strings.Repeat("9", 400)), aTok, 413, "payload_too_large"},
		{"size of 20 digits with a fraction", initBody(d.ID, "a.txt", "text/plain", "10000000000000000000.5"), aTok, 400, "invalid_size"},
		{"dialog not uuid", initBody("nope", "a.txt", "text/plain", 5), aTok, 400, "invalid_uuid"},
		{"not a member", initBody(d.ID, "a.txt", "text/plain", 5), cTok, 404, "dialog_not_found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, b, _ := h.doH(c.tok, "POST", "/v1/attachments", c.body, idemKey())
			wantError(t, code, b, c.status, c.code)
		})
	}
	if code, b, _ := h.doH(aTok, "POST", "/v1/attachments", initBody(d.ID, "a.txt", "Text/Plain; charset=utf-8", max), idemKey()); code != 201 {
		t.Fatalf("size at the limit with a parameterised type: %d %s", code, b)
	}

	// attachmentIds on send: uploaded attachments of this dialog by this
	// sender, each once.
	mine := h.uploadedAttachment(aTok, d.ID)
	bobs := h.uploadedAttachment(bTok, d.ID)
	elsewhere := h.uploadedAttachment(bTok, other.ID)
	code, pb, _ := h.doH(aTok, "POST", "/v1/attachments", initBody(d.ID, "p.txt", "text/plain", 3), idemKey())
	if code != 201 {
		t.Fatal(code)
	}
	pending := decode[uploadResp](t, pb)
	ten := make([]string, 11)
	for i := range ten {
		ten[i] = fmt.Sprintf("%q", ids.New())
	}
	for _, c := range []struct{ name, ids string }{
		{"unknown", fmt.Sprintf("%q", ids.New())},
		{"not uploaded", fmt.Sprintf("%q", pending.ID)},
		{"another sender's", fmt.Sprintf("%q", bobs.ID)},
		{"duplicate", fmt.Sprintf("%q,%q", mine.ID, mine.ID)},
		{"not a uuid", `"nope"`},
		{"over ten", strings.Join(ten, ",")},
	} {
		t.Run("send "+c.name, func(t *testing.T) {
			code, b, _ := h.doH(aTok, "POST", "/v1/dialogs/"+d.ID+"/messages", `{"body":"x","attachmentIds":[`+c.ids+`]}`, idemKey())
			wantError(t, code, b, 400, "invalid_attachment")
		})
	}
	code, b, _ := h.doH(bTok, "POST", "/v1/dialogs/"+d.ID+"/messages", fmt.Sprintf(`{"body":"x","attachmentIds":[%q]}`, elsewhere.ID), idemKey())
	wantError(t, code, b, 400, "invalid_attachment")
	if code, b, _ := h.doH(aTok, "POST", "/v1/dialogs/"+d.ID+"/messages", fmt.Sprintf(`{"body":"x","attachmentIds":[%q]}`, mine.ID), idemKey()); code != 201 {
		t.Fatalf("valid attachment: %d %s", code, b)
	}
	// Linked once only.
	code, b, _ = h.doH(aTok, "POST", "/v1/dialogs/"+d.ID+"/messages", fmt.Sprintf(`{"body":"again","attachmentIds":[%q]}`, mine.ID), idemKey())
	wantError(t, code, b, 400, "invalid_attachment")
	// A rejected send gives its key back: the same key works once fixed.
	if n := h.count("SELECT count(*) FROM messages WHERE dialog_id=$1", d.ID); n != 1 {
		t.Fatalf("rejected sends wrote messages: %d", n)
	}
}

// An expired upload URL is refused, and a replay of its init after the
// expiry answers the same, now expired, URL: a replay is byte-identical to
// the first answer and the record stores no URL.
func TestUploadURLExpiry(t *testing.T) {
	h := newIdemHarness(t, idemOpts{att: restapi.AttachmentConfig{UploadURLTTL: 50 * time.Millisecond}})
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	body := initBody(d.ID, "a.txt", "text/plain", 3)
	code, b1, _ := h.doH(aTok, "POST", "/v1/attachments", body, keyHdr("exp"))
	if code != 201 {
		t.Fatalf("%d %s", code, b1)
	}
	u := decode[uploadResp](t, b1)
	testenv.Eventually(t, 5*time.Second, func() bool { return time.Now().UnixMilli() > u.ExpiresAt }, "clock")
	code, b := h.put(u.UploadURL, "text/plain", "abc")
	wantError(t, code, b, 403, "url_expired")
	code, b2, _ := h.doH(aTok, "POST", "/v1/attachments", body, keyHdr("exp"))
	if code != 201 || !bytes.Equal(b1, b2) {
		t.Fatalf("late replay: %d %s, want %s", code, b2, b1)
	}
}

// The upload body limit is enforced while reading: a chunked body over the
// declared size is cut off with 413 and nothing is stored.
func TestUploadOverDeclaredSizeChunked(t *testing.T) {
	dir := t.TempDir()
	h := newIdemHarness(t, idemOpts{att: restapi.AttachmentConfig{BlobDir: dir}})
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	code, b, _ := h.doH(aTok, "POST", "/v1/attachments", initBody(d.ID, "a.txt", "text/plain", 1024), idemKey())
	if code != 201 {
		t.Fatal(code)
	}
	u := decode[uploadResp](t, b)
	body := &countingReader{left: 64 << 20}
	req, _ := http.NewRequest("PUT", h.srv.URL+u.UploadURL, io.NopCloser(body))
	req.ContentLength = -1
	req.Header.Set("Content-Type", "text/plain")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	wantError(t, resp.StatusCode, rb, 413, "payload_too_large")
	if got := body.read.Load(); got > 32<<20 {
		t.Fatalf("the server kept reading: %d bytes sent", got)
	}
	if n := h.count("SELECT count(*) FROM attachments WHERE id=$1 AND status='pending'", u.ID); n != 1 {
		t.Fatal("the attachment must stay pending")
	}
	var files []string
	_ = filepathWalk(dir, &files)
	if len(files) != 0 {
		t.Fatalf("blob files left behind: %v", files)
	}
}

// filepathWalk lists the regular files under dir.
func filepathWalk(dir string, out *[]string) error {
	return filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() {
			*out = append(*out, p)
		}
		return err
	})
}

// The signed download honours Range (206) and If-None-Match: * (304), and
// the answers http.ServeContent would make in plain text or with no body
// are {"error":"<code>"} like every other error: an unsatisfiable Range is
// 416 range_not_satisfiable (with Content-Range: bytes */<size>), an
// If-Match that cannot hold is 412 precondition_failed.
func TestSignedDownloadErrorsAreJSON(t *testing.T) {
	h := newIdemHarness(t, idemOpts{})
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	u := h.uploadedAttachment(aTok, d.ID) // "abc", text/plain
	dl := h.downloadURL(aTok, u.ID)
	for _, c := range []struct {
		name, method, header, value string
		status                      int
		body, contentRange          string // body: the exact body of a GET
	}{
		{"whole blob", "GET", "", "", 200, "abc", ""},
		{"one range", "GET", "Range", "bytes=1-2", 206, "bc", "bytes 1-2/3"},
		{"If-None-Match *", "GET", "If-None-Match", "*", 304, "", ""},
		{"If-Match *", "GET", "If-Match", "*", 200, "abc", ""},
		{"range past the end", "GET", "Range", "bytes=1000-2000", 416, `{"error":"range_not_satisfiable"}`, "bytes */3"},
		{"malformed range", "GET", "Range", "bytes=x-y", 416, `{"error":"range_not_satisfiable"}`, ""},
		// A suffix of length zero selects no byte (net/http alone answered
		// 206 with "bytes 3-2/3"); beside a satisfiable range it is left out.
		{"empty suffix range", "GET", "Range", "bytes=-0", 416, `{"error":"range_not_satisfiable"}`, "bytes */3"},
		{"HEAD, empty suffix range", "HEAD", "Range", "bytes=-00", 416, "", "bytes */3"},
		{"empty suffix beside a range", "GET", "Range", "bytes=-0, 1-2", 206, "bc", "bytes 1-2/3"},
		{"If-Match a tag", "GET", "If-Match", `"anything"`, 412, `{"error":"precondition_failed"}`, ""},
		{"HEAD, range past the end", "HEAD", "Range", "bytes=1000-2000", 416, "", "bytes */3"},
		{"HEAD, If-Match a tag", "HEAD", "If-Match", `"anything"`, 412, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(c.method, h.srv.URL+dl.URL, nil)
			if c.header != "" {
				req.Header.Set(c.header, c.value)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			hdr := resp.Header
			if resp.StatusCode != c.status || string(body) != c.body || hdr.Get("Content-Range") != c.contentRange {
				t.Fatalf("%d Content-Range %q body %q, want %d %q %q",
					resp.StatusCode, hdr.Get("Content-Range"), body, c.status, c.contentRange, c.body)
			}
			if c.status >= 400 && (hdr.Get("Content-Type") != "application/json" || hdr.Get("Cache-Control") != "no-store" ||
				hdr.Get("Content-Disposition") != "") {
				t.Fatalf("error answer headers: %v", hdr)
			}
		})
	}
}

// Every upload and download in progress holds its blob's file open beside
// its connection. Clients that upload or download slowly near the
// connection cap would otherwise run the process out of descriptors —
// accepts, database dials and log writes failing for everyone — so at
// most MaxOpenBlobs blobs are open at once, and a transfer beyond that is
// refused with 503 attachments_busy and Retry-After, opening nothing. The
// slot comes back when the transfer ends.
func TestOpenBlobsAreBounded(t *testing.T) {
	h := newIdemHarness(t, idemOpts{att: restapi.AttachmentConfig{MaxOpenBlobs: 1}})
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	done := h.uploadedAttachment(aTok, d.ID) // "abc": the slot is free again after it
	dl := h.downloadURL(aTok, done.ID)

	// A slow upload: its first bytes arrive, the rest is held back.
	code, b, _ := h.doH(aTok, "POST", "/v1/attachments", initBody(d.ID, "b.txt", "text/plain", 6), idemKey())
	if code != 201 {
		t.Fatalf("attachment init: %d %s", code, b)
	}
	slow := decode[uploadResp](t, b)
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("PUT", h.srv.URL+slow.UploadURL, pr)
	req.ContentLength = 6
	req.Header.Set("Content-Type", "text/plain")
	answered := make(chan int, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	if _, err := pw.Write([]byte("def")); err != nil {
		t.Fatal(err)
	}

	// While it holds the one slot, a download and another upload are
	// refused at once.
	var resp *http.Response
	testenv.Eventually(t, 5*time.Second, func() bool {
		resp, b = h.get(dl.URL)
		return resp.StatusCode != 200
	}, "the download was served while the slow upload held the only open blob")
	wantError(t, resp.StatusCode, b, 503, "attachments_busy")
	if ra := resp.Header.Get("Retry-After"); ra != "1" {
		t.Fatalf("Retry-After %q, want 1", ra)
	}
	code, b, _ = h.doH(aTok, "POST", "/v1/attachments", initBody(d.ID, "c.txt", "text/plain", 3), idemKey())
	if code != 201 {
		t.Fatalf("attachment init: %d %s", code, b)
	}
	other := decode[uploadResp](t, b)
	code, b = h.put(other.UploadURL, "text/plain", "ghi")
	wantError(t, code, b, 503, "attachments_busy")

	// The slow upload completes; its slot is free again.
	if _, err := pw.Write([]byte("def")); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if code := <-answered; code != 200 {
		t.Fatalf("the slow upload: %d", code)
	}
	if resp, b := h.get(dl.URL); resp.StatusCode != 200 || string(b) != "abc" {
		t.Fatalf("download after the upload ended: %d %s", resp.StatusCode, b)
	}
	if code, b := h.put(other.UploadURL, "text/plain", "ghi"); code != 200 {
		t.Fatalf("the refused upload, retried: %d %s", code, b)
	}
}

// One client cannot take every open-blob slot: its transfers beyond its own
// share (an eighth of the slots) are refused with 503 attachments_busy while
// another client's still go through. A few downloads that never read, from
// one address, refused everybody's uploads and downloads before.
func TestOneClientCannotTakeEveryBlobSlot(t *testing.T) {
	h := newIdemHarness(t, idemOpts{att: restapi.AttachmentConfig{MaxOpenBlobs: 8},
		trusted: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	done := h.uploadedAttachment(aTok, d.ID)
	dl := h.downloadURL(aTok, done.ID)
	from := func(client, method, signed, contentType string, body io.Reader, size int64) *http.Request {
		req, err := http.NewRequest(method, h.srv.URL+signed, body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Forwarded-For", client)
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
			req.ContentLength = size
		}
		return req
	}
	send := func(req *http.Request) (int, []byte) {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	const greedy, other = "203.0.113.5", "198.51.100.7"

	// The greedy client's slow upload holds its one slot.
	code, b, _ := h.doH(aTok, "POST", "/v1/attachments", initBody(d.ID, "b.txt", "text/plain", 6), idemKey())
	if code != 201 {
		t.Fatalf("attachment init: %d %s", code, b)
	}
	slow := decode[uploadResp](t, b)
	pr, pw := io.Pipe()
	answered := make(chan int, 1)
	go func() {
		code, _ := send(from(greedy, "PUT", slow.UploadURL, "text/plain", pr, 6))
		answered <- code
	}()
	if _, err := pw.Write([]byte("def")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		code, _ := send(from(greedy, "GET", dl.URL, "", nil, 0))
		return code == 503
	}, "the greedy client's download was served while its slow upload held its one slot")
	code, b = send(from(greedy, "GET", dl.URL, "", nil, 0))
	wantError(t, code, b, 503, "attachments_busy")
	// Seven slots are free: another client is served.
	if code, b := send(from(other, "GET", dl.URL, "", nil, 0)); code != 200 || string(b) != "abc" {
		t.Fatalf("another client's download while one client holds its share: %d %s", code, b)
	}
	if _, err := pw.Write([]byte("def")); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if code := <-answered; code != 200 {
		t.Fatalf("the slow upload: %d", code)
	}
	if code, b := send(from(greedy, "GET", dl.URL, "", nil, 0)); code != 200 || string(b) != "abc" {
		t.Fatalf("the greedy client's download once its upload ended: %d %s", code, b)
	}
}
