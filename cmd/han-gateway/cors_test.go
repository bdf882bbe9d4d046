package main

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/han-app/gateway/internal/ids"
)

const restOrigin = "https://app.example"

func corsCall(t *testing.T, method, url string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// noCORS asserts an answer carries no CORS header at all.
func noCORS(t *testing.T, what string, h http.Header) {
	t.Helper()
	for k := range h {
		if strings.HasPrefix(k, "Access-Control-") {
			t.Errorf("%s: %s: %q, want no CORS header", what, k, h.Get(k))
		}
	}
}

func hasAll(list string, want ...string) bool {
	got := map[string]bool{}
	for _, v := range strings.Split(list, ",") {
		got[strings.ToLower(strings.TrimSpace(v))] = true
	}
	for _, w := range want {
		if !got[strings.ToLower(w)] {
			return false
		}
	}
	return true
}

// A page of a HAN_CORS_ORIGINS origin may call the REST API: its preflight
// is allowed with the headers the API needs, and the answers it reads
// expose the retry, rate-limit and replay headers. Any other origin,
// including the WebSocket origin of HAN_ALLOWED_ORIGINS, gets no CORS
// header, on a preflight or an actual request.
func TestCORS(t *testing.T) {
	vars := baseEnv()
	vars["HAN_CORS_ORIGINS"] = restOrigin + ", http://localhost:5173"
	m := start(t, vars)
	dialogPath := "/v1/dialogs/" + ids.New() + "/messages"
	preflight := func(origin, path, method string) (*http.Response, string) {
		return corsCall(t, "OPTIONS", m.URL()+path, map[string]string{"Origin": origin,
			"Access-Control-Request-Method": method, "Access-Control-Request-Headers": "authorization,content-type,idempotency-key"})
	}

	for _, path := range []string{dialogPath, "/v1/me", "/projects/" + ids.New() + "/redis/cache"} {
		resp, body := preflight(restOrigin, path, "POST")
		h := resp.Header
		if resp.StatusCode != 204 || body != "" || h.Get("Access-Control-Allow-Origin") != restOrigin {
			t.Fatalf("preflight %s from %s: %d %q, Allow-Origin %q", path, restOrigin, resp.StatusCode, body, h.Get("Access-Control-Allow-Origin"))
		}
		if !hasAll(h.Get("Access-Control-Allow-Headers"), "Authorization", "Content-Type", "Idempotency-Key") ||
			!hasAll(h.Get("Access-Control-Allow-Methods"), "GET", "POST", "PUT", "PATCH", "DELETE") {
			t.Errorf("preflight %s: Allow-Headers %q, Allow-Methods %q", path, h.Get("Access-Control-Allow-Headers"), h.Get("Access-Control-Allow-Methods"))
		}
		if h.Get("Access-Control-Allow-Credentials") != "" || !hasAll(strings.Join(h.Values("Vary"), ","), "Origin") {
			t.Errorf("preflight %s: Allow-Credentials %q, Vary %q", path, h.Get("Access-Control-Allow-Credentials"), h.Values("Vary"))
		}
	}
	for _, origin := range []string{"http://localhost:8080", "https://app.example.evil", "null"} {
		resp, body := preflight(origin, dialogPath, "POST")
		if resp.StatusCode != 204 || body != "" {
			t.Errorf("preflight from %s: %d %q", origin, resp.StatusCode, body)
		}
		noCORS(t, "preflight from "+origin, resp.Header)
	}
	// OPTIONS of a path no route serves is still 404, and tells nothing.
	resp, body := preflight(restOrigin, "/v1/nope", "GET")
	if resp.StatusCode != 404 || body != `{"error":"not_found"}` || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("preflight of an unknown path: %d %s %v", resp.StatusCode, body, resp.Header)
	}

	// Actual requests: success and error answers are readable by the page.
	tok := mintToken(t, ids.New())
	for _, c := range []struct {
		hdr    map[string]string
		status int
	}{
		{map[string]string{"Origin": restOrigin, "Authorization": "Bearer " + tok}, 200},
		{map[string]string{"Origin": restOrigin}, 401},
	} {
		resp, body := corsCall(t, "GET", m.URL()+"/v1/me", c.hdr)
		h := resp.Header
		if resp.StatusCode != c.status || h.Get("Access-Control-Allow-Origin") != restOrigin ||
			!hasAll(h.Get("Access-Control-Expose-Headers"), "Retry-After", "RateLimit", "RateLimit-Policy", "Idempotent-Replayed") {
			t.Errorf("GET /v1/me from %s: %d %s, Allow-Origin %q, Expose %q", restOrigin, resp.StatusCode, body,
				h.Get("Access-Control-Allow-Origin"), h.Get("Access-Control-Expose-Headers"))
		}
		if h.Get("Access-Control-Allow-Credentials") != "" {
			t.Errorf("credentials allowed: %q", h.Get("Access-Control-Allow-Credentials"))
		}
	}
	resp, _ = corsCall(t, "GET", m.URL()+"/v1/me", map[string]string{"Origin": "http://localhost:8080", "Authorization": "Bearer " + tok})
	if resp.StatusCode != 200 {
		t.Errorf("GET /v1/me from another origin: %d (CORS is the browser's to enforce)", resp.StatusCode)
	}
	noCORS(t, "GET from another origin", resp.Header)
	// The web client's own paths are not part of the REST API.
	resp, _ = corsCall(t, "GET", m.URL()+"/", map[string]string{"Origin": restOrigin})
	noCORS(t, "the web client", resp.Header)
}

// Without HAN_CORS_ORIGINS no origin gets a CORS header; OPTIONS still
// answers 204 rather than 405.
func TestCORSOff(t *testing.T) {
	m := start(t, baseEnv())
	resp, body := corsCall(t, "OPTIONS", m.URL()+"/v1/dialogs", map[string]string{"Origin": restOrigin, "Access-Control-Request-Method": "POST"})
	if resp.StatusCode != 204 || body != "" {
		t.Errorf("OPTIONS /v1/dialogs: %d %q", resp.StatusCode, body)
	}
	noCORS(t, "preflight with CORS off", resp.Header)
}
