package restapi_test

import (
	"mime"
	"net/http"
	"strings"
	"testing"

	"github.com/han-app/gateway/restapi"
)

// downloadOf uploads body as an attachment named name and returns the
// signed download's answer.
func downloadOf(t *testing.T, h *harness, tok, dialogID, name, body string) *http.Response {
	t.Helper()
	code, b, _ := h.doH(tok, "POST", "/v1/attachments", initBody(dialogID, name, "text/plain", len(body)), idemKey())
	if code != 201 {
		t.Fatalf("init %q: %d %s", name, code, b)
	}
	u := decode[uploadResp](t, b)
	if code, b := h.put(u.UploadURL, "text/plain", body); code != 200 {
		t.Fatalf("upload: %d %s", code, b)
	}
	code, b = h.do(tok, "GET", "/v1/attachments/"+u.ID+"/download-url", "")
	if code != 200 {
		t.Fatalf("download url: %d %s", code, b)
	}
	resp, _ := h.get(decode[downloadResp](t, b).URL)
	return resp
}

// A downloaded file is saved under the name it was uploaded with: the
// Content-Disposition's filename* parses (strict parsers drop a parameter
// with a character outside RFC 8187's attr-char, and the browser then
// saves the file without its name or extension) and gives back the name
// exactly; clients that read only filename get an ASCII approximation of
// it, with the extension.
func TestDownloadKeepsTheFilename(t *testing.T) {
	h, _ := attHarness(t, 0, restapi.AttachmentConfig{})
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	for _, c := range []struct{ name, ascii string }{
		{"Meeting 10:30.txt", "Meeting 10:30.txt"},
		{"me@home.txt", "me@home.txt"},
		{"a=b;c.txt", "a=b;c.txt"},
		{"100% (final)'s.txt", "100% (final)'s.txt"},
		{`say "hi".txt`, "say _hi_.txt"},
		{"отчёт 1.txt", "_____ 1.txt"},
		{"写真.txt", "__.txt"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cd := downloadOf(t, h, aTok, d.ID, c.name, "abc").Header.Get("Content-Disposition")
			disp, params, err := mime.ParseMediaType(cd)
			if err != nil || disp != "attachment" || params["filename"] != c.name {
				t.Fatalf("Content-Disposition %q: %q %q %v, want filename %q", cd, disp, params["filename"], err, c.name)
			}
			plain, _, ok := strings.Cut(cd, "; filename*=")
			if !ok {
				t.Fatalf("Content-Disposition %q has no filename*", cd)
			}
			disp, params, err = mime.ParseMediaType(plain)
			if err != nil || disp != "attachment" || params["filename"] != c.ascii {
				t.Fatalf("the filename parameter of %q: %q %v, want %q", cd, params["filename"], err, c.ascii)
			}
		})
	}
}

// A filename with a Unicode format character (bidirectional overrides and
// isolates, marks, zero-width characters, the byte order mark) is refused
// with 400 invalid_filename: "invoice\u202Efdp.exe" shows as
// "invoiceexe.pdf" in every client that displays it. Names in any script
// are still accepted.
func TestFilenameWithFormatCharactersRefused(t *testing.T) {
	h, _ := attHarness(t, 0, restapi.AttachmentConfig{})
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	for _, name := range []string{
		"invoice\u202efdp.exe",     // RIGHT-TO-LEFT OVERRIDE
		"photo\u2067gpj.exe\u2069", // RIGHT-TO-LEFT ISOLATE … POP DIRECTIONAL ISOLATE
		"a\u200e.txt",              // LEFT-TO-RIGHT MARK
		"pay\u200bpal.pdf",         // ZERO WIDTH SPACE
		"\ufeffreport.pdf",         // BYTE ORDER MARK
	} {
		code, b, _ := h.doH(aTok, "POST", "/v1/attachments", initBody(d.ID, name, "application/zip", 3), idemKey())
		if code != 400 || !strings.Contains(string(b), `"invalid_filename"`) {
			t.Errorf("filename %+q: %d %s, want 400 invalid_filename", name, code, b)
		}
	}
	for _, name := range []string{"отчёт.pdf", "写真 2024.zip", "تقرير.pdf", "café.txt"} {
		if code, b, _ := h.doH(aTok, "POST", "/v1/attachments", initBody(d.ID, name, "application/zip", 3), idemKey()); code != 201 {
			t.Errorf("filename %q: %d %s, want 201", name, code, b)
		}
	}
}

// A filename with a line or paragraph separator (U+2028, U+2029) is
// refused with 400 invalid_filename, as a dialog title with one is: it
// breaks the line where the name is shown, so "report.pdf\u2028.exe" poses
// as "report.pdf" with ".exe" on the next line.
func TestFilenameWithLineSeparatorRefused(t *testing.T) {
	h, _ := attHarness(t, 0, restapi.AttachmentConfig{})
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	for _, name := range []string{"report.pdf\u2028.exe", "report.pdf\u2029.exe"} {
		code, b, _ := h.doH(aTok, "POST", "/v1/attachments", initBody(d.ID, name, "application/pdf", 10), idemKey())
		if code != 400 || !strings.Contains(string(b), `"invalid_filename"`) {
			t.Errorf("filename %+q: %d %s, want 400 invalid_filename", name, code, b)
		}
	}
}

// HEAD of a signed download answers exactly the headers GET would (type,
// length, disposition and the headers that keep a browser from running
// the file), so a client can check a file before fetching it.
func TestSignedDownloadHeadHasTheGetHeaders(t *testing.T) {
	h, _ := attHarness(t, 0, restapi.AttachmentConfig{})
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	u := h.uploadedAttachment(aTok, d.ID)
	dl := h.downloadURL(aTok, u.ID)
	get, body := h.get(dl.URL)
	if get.StatusCode != 200 || string(body) != "abc" {
		t.Fatalf("GET: %d %q", get.StatusCode, body)
	}
	req, _ := http.NewRequest("HEAD", h.srv.URL+dl.URL, nil)
	head, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	head.Body.Close()
	if head.StatusCode != 200 {
		t.Fatalf("HEAD: %d", head.StatusCode)
	}
	for _, k := range []string{"Content-Type", "Content-Length", "Content-Disposition", "X-Content-Type-Options",
		"Content-Security-Policy", "Cache-Control"} {
		if head.Header.Get(k) != get.Header.Get(k) || get.Header.Get(k) == "" {
			t.Errorf("%s: HEAD %q, GET %q", k, head.Header.Get(k), get.Header.Get(k))
		}
	}
}
