package web_test

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/han-app/gateway/web"
)

func get(t *testing.T, p string) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	web.Handler("").ServeHTTP(rec, httptest.NewRequest(http.MethodGet, p, nil))
	return rec.Result()
}

// The page is served with a CSP that allows only this origin's scripts (no
// inline script), blob: images for attachment previews, and connections to
// this origin alone, framed by no page (frame-ancestors, X-Frame-Options),
// and in a browsing context group of its own (no window of another origin
// holds a reference to it).
func TestServesTheClientWithItsSecurityHeaders(t *testing.T) {
	res := get(t, "/")
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 || !strings.Contains(string(body), `<script type="module" src="js/main.js">`) {
		t.Fatalf("GET /: %d %.200s", res.StatusCode, body)
	}
	csp := res.Header.Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'self'", "script-src 'self'", "img-src 'self' blob:", "connect-src 'self';", "frame-ancestors 'none'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("CSP %q lacks %q", csp, want)
		}
	}
	if strings.Contains(csp, "unsafe-inline") || strings.Contains(csp, "unsafe-eval") {
		t.Errorf("CSP allows inline code: %q", csp)
	}
	for h, want := range map[string]string{"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache",
		"Cross-Origin-Opener-Policy": "same-origin", "X-Frame-Options": "DENY"} {
		if got := res.Header.Get(h); got != want {
			t.Errorf("%s: %q, want %q", h, got, want)
		}
	}
	if ct := get(t, "/js/main.js").Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/javascript") {
		t.Errorf("module served as %q (browsers refuse modules that are not JavaScript under nosniff)", ct)
	}
}

// The deployment's realtime origin (HAN_PUBLIC_REALTIME_URL) is the one
// other origin the page may connect to: its scheme, host and port, never
// its path or credentials. A value that is no ws: or wss: URL, or whose
// host could end the directive, adds nothing.
func TestTheCSPNamesTheRealtimeOriginOnly(t *testing.T) {
	for raw, want := range map[string]string{
		"":                                      "connect-src 'self';",
		"wss://RT.example.com/v1/realtime":      "connect-src 'self' wss://rt.example.com;",
		"ws://127.0.0.1:8080/v1/realtime?x=1":   "connect-src 'self' ws://127.0.0.1:8080;",
		"wss://user:pw@rt.example.com/realtime": "connect-src 'self' wss://rt.example.com;",
		"wss://[::1]:9443/v1/realtime":          "connect-src 'self' wss://[::1]:9443;",
		"https://rt.example.com/v1/realtime":    "connect-src 'self';",
		"wss://rt.example.com;script-src*/x":    "connect-src 'self';",
		"not a url":                             "connect-src 'self';",
	} {
		rec := httptest.NewRecorder()
		web.Handler(raw).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		if csp := rec.Result().Header.Get("Content-Security-Policy"); !strings.Contains(csp, want) {
			t.Errorf("realtime URL %q: CSP %q, want %q", raw, csp, want)
		}
	}
}

var (
	importRe = regexp.MustCompile(`(?m)^(?:import|export) [^;]*? from "(\.\.?/[^"]+)";|import\("(/[^"]+)"\)`)
	refRe    = regexp.MustCompile(`(?:src|href)="([^"#:]+)"`)
)

// Every module import and every file index.html names is embedded: a
// missing or misspelled file would break the page only in a browser.
func TestEveryReferencedFileIsEmbedded(t *testing.T) {
	files := web.Files()
	exists := func(p string) bool {
		_, err := fs.Stat(files, strings.TrimPrefix(path.Clean(p), "/"))
		return err == nil
	}
	idx, err := fs.ReadFile(files, "index.html")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range refRe.FindAllStringSubmatch(string(idx), -1) {
		if !exists(m[1]) {
			t.Errorf("index.html references %s, which is not embedded", m[1])
		}
	}
	mods, _ := fs.Glob(files, "js/*.js")
	sdk, _ := fs.Glob(files, "sdk/*.js")
	mods = append(mods, sdk...)
	if len(mods) < 10 {
		t.Fatalf("modules: %v", mods)
	}
	for _, m := range mods {
		src, _ := fs.ReadFile(files, m)
		for _, im := range importRe.FindAllStringSubmatch(string(src), -1) {
			ref := im[1]
			if ref != "" {
				ref = path.Join(path.Dir(m), ref)
			} else {
				ref = im[2]
			}
			if !exists(ref) {
				t.Errorf("%s imports %s, which is not embedded", m, ref)
			}
		}
	}
}

// The SDK's runtime modules are served under /sdk/ as JavaScript; its
// tests, examples and package files are not served at all.
func TestServesTheSDKModulesOnly(t *testing.T) {
	for _, p := range []string{"/sdk/index.js", "/sdk/realtime.js", "/sdk/rest.js"} {
		res := get(t, p)
		body, _ := io.ReadAll(res.Body)
		if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/javascript") || len(body) == 0 {
			t.Errorf("GET %s: %d %q", p, res.StatusCode, res.Header.Get("Content-Type"))
		}
		if res.Header.Get("Content-Security-Policy") == "" {
			t.Errorf("GET %s: no CSP", p)
		}
	}
	for _, p := range []string{"/sdk/package.json", "/sdk/package-lock.json", "/sdk/jsconfig.json",
		"/sdk/test/helpers.js", "/sdk/node_modules/ws/package.json"} {
		if res := get(t, p); res.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", p, res.StatusCode)
		}
	}
	main, err := fs.ReadFile(web.Files(), "js/main.js")
	if err != nil || !strings.Contains(string(main), `from "../sdk/index.js"`) {
		t.Errorf("js/main.js does not import the SDK (%v)", err)
	}
}

// The client's folders are not browsable: a directory answers 404 instead
// of a listing of its files (the root serves the page).
func TestDirectoriesAreNotListed(t *testing.T) {
	for _, p := range []string{"/js/", "/sdk/", "/js", "/sdk", "/js/../sdk/"} {
		res := get(t, p)
		body, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusNotFound || strings.Contains(string(body), "<a href=") {
			t.Errorf("GET %s: %d, want 404 without a listing:\n%.300s", p, res.StatusCode, body)
		}
	}
	if res := get(t, "/"); res.StatusCode != http.StatusOK {
		t.Errorf("GET /: %d", res.StatusCode)
	}
}
