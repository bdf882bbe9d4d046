package restapi_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/restapi"
)

// attHarness is an API server on real Redis/PostgreSQL with the given body
// timeout (zero: the default) and attachment settings, a blob folder of the
// test's own unless att names one, and its log kept.
func attHarness(t *testing.T, bodyTimeout time.Duration, att restapi.AttachmentConfig) (*harness, *testenv.LogBuffer) {
	t.Helper()
	if att.BlobDir == "" {
		att.BlobDir = t.TempDir()
	}
	return newHarness(t).withLog(func(d *restapi.Deps) {
		d.Config.BodyTimeout = bodyTimeout
		d.Config.Attachments = att
	})
}

// rawPut opens a connection and sends the headers of a PUT to the signed
// URL declaring size bytes, and no body. extra headers are whole lines.
func rawPut(t *testing.T, h *harness, signed, contentType string, size int64, extra ...string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(h.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "PUT %s HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nContent-Length: %d\r\n", signed, contentType, size)
	for _, line := range extra {
		fmt.Fprintf(c, "%s\r\n", line)
	}
	fmt.Fprint(c, "\r\n")
	return c
}

// Uploads and downloads share MaxOpenBlobs slots per instance. A client
// that sends the headers of the largest upload and then nothing, stops
// after its first bytes, or trickles a byte now and then, must not keep
// the slots from everybody else: it is cut off (408 request_timeout)
// within about the body timeout of falling behind, not after the
// allowance of the length it declared (over 400 s for 25 MiB), and a
// silent one never takes a slot at all.
func TestStalledUploadsDoNotLockOutTransfers(t *testing.T) {
	const base = 500 * time.Millisecond
	for _, c := range []struct {
		name  string
		first string        // body bytes sent at once
		every time.Duration // then one byte this often; zero: nothing more
	}{
		{"silent after its headers", "", 0},
		{"stops after its first bytes", "PK", 0},
		{"trickles a byte at a time", "P", base / 5},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, _ := attHarness(t, base, restapi.AttachmentConfig{MaxOpenBlobs: 1})
			_, aTok := h.user()
			bob, _ := h.user()
			d := h.dialog(aTok, bob)
			victim := h.uploadedAttachment(aTok, d.ID) // "abc"
			dl := h.downloadURL(aTok, victim.ID)
			code, b, _ := h.doH(aTok, "POST", "/v1/attachments",
				initBody(d.ID, "big.zip", "application/zip", restapi.DefaultAttachmentMaxBytes), idemKey())
			if code != 201 {
				t.Fatalf("init: %d %s", code, b)
			}
			up := decode[uploadResp](t, b)

			began := time.Now()
			var conn net.Conn
			var rd *bufio.Reader
			if c.first == "" {
				// The silent client asks before sending its body (Expect:
				// 100-continue): the server's "100 Continue" says the
				// upload has passed its check of the slots (it refuses a
				// body with attachments_busy while every slot is taken)
				// and waits for the first bytes, so the download below
				// does not race that check for the one slot.
				conn = rawPut(t, h, up.UploadURL, "application/zip", restapi.DefaultAttachmentMaxBytes, "Expect: 100-continue")
				rd = bufio.NewReader(conn)
				_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
				resp, err := http.ReadResponse(rd, nil)
				if err != nil || resp.StatusCode != http.StatusContinue {
					t.Fatalf("the upload's body was not asked for: %v %v", resp, err)
				}
			} else {
				conn = rawPut(t, h, up.UploadURL, "application/zip", restapi.DefaultAttachmentMaxBytes)
				rd = bufio.NewReader(conn)
				if _, err := io.WriteString(conn, c.first); err != nil {
					t.Fatal(err)
				}
			}
			stop := make(chan struct{})
			defer close(stop)
			if c.every > 0 {
				go func() {
					tick := time.NewTicker(c.every)
					defer tick.Stop()
					for {
						select {
						case <-stop:
							return
						case <-tick.C:
						}
						if _, err := conn.Write([]byte("K")); err != nil {
							return
						}
					}
				}()
			}
			if c.first == "" {
				// Nothing arrived: the slot is everybody else's meanwhile.
				if resp, got := h.get(dl.URL); resp.StatusCode != 200 || string(got) != "abc" {
					t.Fatalf("a download while an upload sent no body byte: %d %s", resp.StatusCode, got)
				}
			}

			_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
			resp, err := http.ReadResponse(rd, nil)
			if err != nil {
				t.Fatalf("no answer to the stalled upload within 30 s: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			took := time.Since(began)
			wantError(t, resp.StatusCode, body, 408, "request_timeout")
			if took > 10*base {
				t.Fatalf("the stalled upload was cut off after %v, want about %v", took, base)
			}
			testenv.Eventually(t, 5*time.Second, func() bool {
				resp, got := h.get(dl.URL)
				return resp.StatusCode == 200 && string(got) == "abc"
			}, "the download is refused after the stalled upload was cut off")
		})
	}
}

// A body that keeps arriving at MinTransferRate or faster is never cut off
// by the body deadline, even when it is far longer than the base timeout.
// (The base is also the longest silence allowed between two reads: it is
// kept well above the pauses between the chunks, which a loaded machine
// stretches.)
func TestSteadyUploadLongerThanTheBodyTimeoutSucceeds(t *testing.T) {
	const base = 500 * time.Millisecond
	h, _ := attHarness(t, base, restapi.AttachmentConfig{})
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	const chunk, chunks = 16 << 10, 32 // 512 KiB at 256 KiB/s (4× MinTransferRate): 2 s, 4× the base
	code, b, _ := h.doH(aTok, "POST", "/v1/attachments", initBody(d.ID, "steady.zip", "application/zip", chunk*chunks), idemKey())
	if code != 201 {
		t.Fatalf("init: %d %s", code, b)
	}
	up := decode[uploadResp](t, b)
	conn := rawPut(t, h, up.UploadURL, "application/zip", chunk*chunks)
	for range chunks {
		if _, err := conn.Write(make([]byte, chunk)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(chunk * time.Second / (256 << 10))
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("a steady upload of %v: %d %s", chunks*chunk*time.Second/(256<<10), resp.StatusCode, body)
	}
}

// One signed upload URL is one upload at a time on an instance: a second
// PUT while the first is being received is refused at once with 409
// upload_in_progress and Retry-After, instead of each holding a connection
// and a blob slot for the same attachment. Concurrent uploads of different
// bytes leave exactly one winner and one blob, served intact.
func TestOneUploadPerAttachmentAtATime(t *testing.T) {
	dir := t.TempDir()
	h, _ := attHarness(t, 0, restapi.AttachmentConfig{BlobDir: dir})
	_, aTok := h.user()
	bob, bTok := h.user()
	d := h.dialog(aTok, bob)

	t.Run("a second PUT while the first is under way", func(t *testing.T) {
		code, b, _ := h.doH(aTok, "POST", "/v1/attachments", initBody(d.ID, "a.txt", "text/plain", 6), idemKey())
		if code != 201 {
			t.Fatalf("init: %d %s", code, b)
		}
		u := decode[uploadResp](t, b)
		// The first PUT asks to continue: the server answers 100 only
		// when the handler reads the body, so the upload is under way
		// (registered) before the second PUT is sent.
		conn, err := net.Dial("tcp", strings.TrimPrefix(h.srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		fmt.Fprintf(conn, "PUT %s HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 6\r\nExpect: 100-continue\r\n\r\n", u.UploadURL)
		br := bufio.NewReader(conn)
		if cont, err := http.ReadResponse(br, nil); err != nil || cont.StatusCode != http.StatusContinue {
			t.Fatalf("the first PUT was not asked to continue: %v %v", cont, err)
		}
		if _, err := io.WriteString(conn, "abc"); err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("PUT", h.srv.URL+u.UploadURL, strings.NewReader("abcdef"))
		req.Header.Set("Content-Type", "text/plain")
		resp2, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b2, _ := io.ReadAll(resp2.Body)
		resp2.Body.Close()
		if resp2.StatusCode == 409 && resp2.Header.Get("Retry-After") != "1" {
			t.Fatalf("409 without Retry-After: 1: %v", resp2.Header)
		}
		wantError(t, resp2.StatusCode, b2, 409, "upload_in_progress")
		if _, err := io.WriteString(conn, "def"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("the first upload: %d", resp.StatusCode)
		}
		if code, b := h.put(u.UploadURL, "text/plain", "abcdef"); code != 200 {
			t.Fatalf("a retry of the same bytes after the upload ended: %d %s", code, b)
		}
	})

	t.Run("concurrent uploads of different bytes", func(t *testing.T) {
		code, b, _ := h.doH(aTok, "POST", "/v1/attachments", initBody(d.ID, "b.txt", "text/plain", 4096), idemKey())
		if code != 201 {
			t.Fatalf("init: %d %s", code, b)
		}
		u := decode[uploadResp](t, b)
		var wg sync.WaitGroup
		codes := make([]int, 8)
		bodies := make([][]byte, 8)
		for i := range codes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				codes[i], bodies[i] = h.put(u.UploadURL, "text/plain", strings.Repeat(string(rune('a'+i)), 4096))
			}()
		}
		wg.Wait()
		ok := 0
		for i, c := range codes {
			switch {
			case c == 200:
				ok++
			case c == 409 && (strings.Contains(string(bodies[i]), "upload_in_progress") ||
				strings.Contains(string(bodies[i]), "attachment_already_uploaded")):
			default:
				t.Fatalf("upload %d: %d %s", i, c, bodies[i])
			}
		}
		var files []string
		_ = filepathWalk(dir, &files)
		blobs := 0
		for _, f := range files {
			if strings.Contains(f, u.ID) {
				blobs++
			}
		}
		if ok != 1 || blobs != 1 {
			t.Fatalf("codes %v, %d blob files of the attachment; want one winner and one blob", codes, blobs)
		}
		code, b = h.do(bTok, "GET", "/v1/attachments/"+u.ID+"/download-url", "")
		if code != 200 {
			t.Fatalf("download url: %d %s", code, b)
		}
		resp, got := h.get(decode[downloadResp](t, b).URL)
		if resp.StatusCode != 200 || len(got) != 4096 || strings.Count(string(got), string(got[0])) != 4096 {
			t.Fatalf("download: %d, %d bytes, mixed: %v", resp.StatusCode, len(got), strings.Count(string(got), string(got[:1])) != len(got))
		}
	})
}

// A blob store that cannot store (a full disk, a folder gone or
// unwritable) is its own failure, not a database outage: a full disk is
// 507 insufficient_storage (a retry cannot succeed until space is freed),
// any other 503 blob_store_unavailable with Retry-After; it is logged at
// Error level without the file's path and counted under its own
// han_dependency_errors_total label, never as PostgreSQL unavailable. The
// attachment stays pending, so the upload can be retried once the store
// is repaired.
func TestBlobStoreFailureIsNotADatabaseOutage(t *testing.T) {
	for _, c := range []struct {
		name       string
		break_     func(t *testing.T, dir string) // nil: a 64 KiB tmpfs the upload overflows
		size       int
		status     int
		code       string
		retryAfter string
		metric     string
	}{
		{"folder replaced by a file", func(t *testing.T, dir string) {
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dir, []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, 3, 503, "blob_store_unavailable", "5", `dependency="blob_store",kind="unavailable"`},
		{"disk full", nil, 256 << 10, 507, "insufficient_storage", "", `dependency="blob_store",kind="full"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "blobs")
			if c.break_ == nil {
				if err := os.MkdirAll(dir, 0o700); err != nil {
					t.Fatal(err)
				}
				if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
					// Mounting needs root. CI runs as root and must run this
					// case; elsewhere the mapping of ENOSPC itself is still
					// checked by store's TestBlobStoreFailuresAreNotPostgresOutages.
					if os.Getenv("CI") == "true" {
						t.Fatalf("cannot mount a small tmpfs (CI runs as root and must run this case): %v %s", err, out)
					}
					t.Skipf("cannot mount a small tmpfs (needs root; CI runs it): %v %s", err, out)
				}
				t.Cleanup(func() { _ = exec.Command("umount", dir).Run() })
			}
			h, logs := attHarness(t, 0, restapi.AttachmentConfig{BlobDir: dir})
			_, aTok := h.user()
			bob, _ := h.user()
			d := h.dialog(aTok, bob)
			code, b, _ := h.doH(aTok, "POST", "/v1/attachments", initBody(d.ID, "a.zip", "application/zip", c.size), idemKey())
			if code != 201 {
				t.Fatalf("init: %d %s", code, b)
			}
			u := decode[uploadResp](t, b)
			if c.break_ != nil {
				c.break_(t, dir)
			}
			req, _ := http.NewRequest("PUT", h.srv.URL+u.UploadURL, strings.NewReader(strings.Repeat("z", c.size)))
			req.Header.Set("Content-Type", "application/zip")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			wantError(t, resp.StatusCode, b, c.status, c.code)
			if ra := resp.Header.Get("Retry-After"); ra != c.retryAfter {
				t.Fatalf("Retry-After %q, want %q", ra, c.retryAfter)
			}
			_, metrics := h.do("", "GET", "/metrics", "")
			for _, want := range []string{
				`han_dependency_errors_total{dependency="postgres",kind="unavailable"} 0`,
				"han_dependency_errors_total{" + c.metric + "} 1",
			} {
				if !strings.Contains(string(metrics), want) {
					t.Errorf("/metrics lacks %s:\n%s", want, grepLines(metrics, "han_dependency_errors_total"))
				}
			}
			log := logs.String()
			if !strings.Contains(log, `"level":"ERROR"`) || !strings.Contains(log, `"msg":"blob store`) ||
				strings.Contains(log, dir) || strings.Contains(log, "database unavailable") {
				t.Errorf("log: want an Error-level blob store line without the folder %s:\n%s", dir, log)
			}
			if n := h.count("SELECT count(*) FROM attachments WHERE id=$1 AND status='pending'", u.ID); n != 1 {
				t.Fatalf("the attachment is no longer pending after the failed upload")
			}
		})
	}
}

// A download whose blob cannot be opened because the store is broken is
// 503 blob_store_unavailable, not a database outage.
func TestDownloadFromABrokenBlobStore(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "blobs")
	h, _ := attHarness(t, 0, restapi.AttachmentConfig{BlobDir: dir})
	_, aTok := h.user()
	bob, _ := h.user()
	d := h.dialog(aTok, bob)
	u := h.uploadedAttachment(aTok, d.ID)
	dl := h.downloadURL(aTok, u.ID)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	resp, got := h.get(dl.URL)
	wantError(t, resp.StatusCode, got, 503, "blob_store_unavailable")
}
