package main

import (
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/gorilla/mux"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/restapi"
)

// jsonError does one request and asserts the answer is exactly
// {"error":code} as JSON with status; it returns the Allow header.
func jsonError(t *testing.T, m *Main, tok, method, path string, status int, code string) string {
	t.Helper()
	req, _ := http.NewRequest(method, m.URL()+path, nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	want := `{"error":"` + code + `"}`
	if resp.StatusCode != status || string(body) != want || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("%s %s: %d %q (%s), want %d %s as JSON", method, path, resp.StatusCode, body,
			resp.Header.Get("Content-Type"), status, want)
	}
	return resp.Header.Get("Allow")
}

var routeVar = regexp.MustCompile(`\{[^}]*\}`)

// Every path the service owns (/v1, /projects, /debug, /metrics, /healthz,
// /readyz) answers its errors as {"error":code}: unknown paths under each
// registered route are 404 not_found, and every method a route does not
// serve is 405 method_not_allowed naming the served ones in Allow. The web
// client keeps serving its own pages.
func TestEveryAPIErrorIsJSON(t *testing.T) {
	vars := baseEnv()
	vars[debugEnv] = "1"
	m := start(t, vars)
	tok := mintToken(t, ids.New())
	if m.ops.stub != nil {
		t.Fatal("the legacy safety stub is on by default")
	}

	// Methods served per path template, over every registered route.
	served := map[string][]string{}
	methodless := map[string]bool{}
	err := m.api.Router().Walk(func(route *mux.Route, _ *mux.Router, _ []*mux.Route) error {
		tpl, err := route.GetPathTemplate()
		if err != nil || route.GetHandler() == nil || route.GetName() == restapi.FallbackRouteName {
			return nil // a subrouter's prefix, or the web client
		}
		if ms, err := route.GetMethods(); err == nil {
			served[tpl] = append(served[tpl], ms...)
		} else {
			methodless[tpl] = true // dispatches by method itself
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(served) < 10 || len(methodless) < 5 {
		t.Fatalf("router walk found too few routes: %v %v", served, methodless)
	}
	concrete := func(tpl string) string { return routeVar.ReplaceAllString(tpl, ids.New()) }
	for tpl, ms := range served {
		path := concrete(tpl)
		for _, method := range []string{"GET", "POST", "PUT", "PATCH", "DELETE", "TRACE"} {
			if slices.Contains(ms, method) {
				continue
			}
			allow := strings.Split(jsonError(t, m, tok, method, path, 405, "method_not_allowed"), ", ")
			for _, want := range ms {
				if !slices.Contains(allow, want) {
					t.Errorf("%s %s: Allow %q lacks %s", method, tpl, allow, want)
				}
			}
		}
		jsonError(t, m, tok, "GET", strings.TrimSuffix(path, "/")+"/no/such/path", 404, "not_found")
		noContentOptions(t, m, path)
	}
	for tpl := range methodless {
		path := concrete(tpl)
		if allow := jsonError(t, m, tok, "TRACE", path, 405, "method_not_allowed"); allow == "" {
			t.Errorf("TRACE %s: 405 without Allow", tpl)
		}
		noContentOptions(t, m, path)
		jsonError(t, m, tok, "GET", strings.TrimSuffix(path, "/")+"/no/such/path", 404, "not_found")
	}

	// Unknown paths under each root, and routes that are off.
	pid := ids.New()
	for _, p := range []string{"/v1", "/v1/nope", "/v1/nope/deeper", "/projects", "/projects/nope",
		"/projects/" + pid + "/redis/nope", "/debug", "/debug/nope", "/debug/pprof/nope",
		"/metrics/nope", "/healthz/nope", "/readyz/nope",
		"/v1/messages/" + ids.New() + "/safety"} {
		jsonError(t, m, tok, "GET", p, 404, "not_found")
		jsonError(t, m, tok, "POST", p, 404, "not_found")
	}
	if allow := jsonError(t, m, tok, "GET", "/v1/realtime/tickets", 405, "method_not_allowed"); allow != "POST" {
		t.Errorf("GET /v1/realtime/tickets: Allow %q, want POST", allow)
	}
	if allow := jsonError(t, m, tok, "POST", "/debug/memstats", 405, "method_not_allowed"); allow != "GET, HEAD" {
		t.Errorf("POST /debug/memstats: Allow %q", allow)
	}

	// The web client still serves its pages (and its own 404s).
	for _, p := range []string{"/", "/index.html", "/app.css", "/js/main.js"} {
		resp, err := http.Get(m.URL() + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Content-Security-Policy") == "" {
			t.Errorf("GET %s: %d, want the web client's page", p, resp.StatusCode)
		}
	}
}

// noContentOptions asserts OPTIONS on a served path is 204 without a body:
// OPTIONS is no method mismatch (a CORS preflight asks it, cors.go).
func noContentOptions(t *testing.T, m *Main, path string) {
	t.Helper()
	req, _ := http.NewRequest("OPTIONS", m.URL()+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 204 || len(b) != 0 {
		t.Errorf("OPTIONS %s: %d %q, want 204", path, resp.StatusCode, b)
	}
}
