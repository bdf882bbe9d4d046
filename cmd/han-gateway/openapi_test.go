package main

import (
	"bytes"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/gorilla/mux"

	"github.com/han-app/gateway/docs"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/internal/testenv/apicheck"
	"github.com/han-app/gateway/restapi"
)

// documented reports whether the description covers a route template: the
// REST roots, not /metrics, /debug or the web client.
func documented(tpl string) bool {
	return tpl == "/healthz" || tpl == "/readyz" || strings.HasPrefix(tpl, "/v1/") || strings.HasPrefix(tpl, "/projects/")
}

// docs/openapi.yaml names exactly the operations the router serves: every
// method of every route under /v1, /projects, /healthz and /readyz is a
// documented operation, and every documented operation is served. HEAD is
// served wherever GET is, as the description says once for all; a HEAD is
// listed only where its answers need words of their own. The
// program runs with every optional route on (realtime, the legacy safety
// stub).
func TestOpenAPIMatchesTheRouter(t *testing.T) {
	rs, err := testenv.StartRedis(testenv.RedisOptions{LegacyStubPassword: "stub-openapi-password"})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	vars := baseEnv()
	vars["REDIS_URL"], vars["REDIS_REALTIME_URL"] = rs.URL(0), rs.URL(1)
	vars["HAN_LEGACY_STUB_ENABLED"], vars["HAN_LEGACY_STUB_URL"] = "true", rs.LegacyStubURL(2)
	m := start(t, vars)
	tok := mintToken(t, ids.New())

	served := map[string]bool{}
	err = m.api.Router().Walk(func(route *mux.Route, _ *mux.Router, _ []*mux.Route) error {
		tpl, err := route.GetPathTemplate()
		if err != nil || route.GetHandler() == nil || route.GetName() == restapi.FallbackRouteName || !documented(tpl) {
			return nil
		}
		ms, err := route.GetMethods()
		if err != nil { // dispatches by method itself: its 405 names them
			ms = strings.Split(methodsOf(t, m, tok, routeVar.ReplaceAllString(tpl, ids.New())), ", ")
		}
		for _, method := range ms {
			served[method+" "+tpl] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	check, err := apicheck.Load()
	if err != nil {
		t.Fatal(err)
	}
	described := map[string]bool{}
	for path, item := range check.Doc().Paths.Map() {
		for method := range item.Operations() {
			described[method+" "+path] = true
		}
	}
	if len(served) < 25 {
		t.Fatalf("the router walk found only %d operations: %v", len(served), served)
	}
	for op := range served {
		if tpl, ok := strings.CutPrefix(op, "HEAD "); ok && described["GET "+tpl] {
			continue
		}
		if !described[op] {
			t.Errorf("%s is served but not in docs/openapi.yaml", op)
		}
	}
	for op := range described {
		if !served[op] {
			t.Errorf("%s is in docs/openapi.yaml but not served", op)
		}
	}
}

// methodsOf asks a path for its methods: TRACE is served nowhere, so the
// answer is 405 with Allow.
func methodsOf(t *testing.T, m *Main, tok, path string) string {
	t.Helper()
	req, _ := http.NewRequest("TRACE", m.URL()+path, nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 || resp.Header.Get("Allow") == "" {
		t.Fatalf("TRACE %s: %d, Allow %q", path, resp.StatusCode, resp.Header.Get("Allow"))
	}
	return resp.Header.Get("Allow")
}

// GET /v1/openapi.json serves docs/openapi.yaml as JSON without a token.
func TestOpenAPIServed(t *testing.T) {
	m := start(t, baseEnv())
	resp, err := http.Get(m.URL() + "/v1/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	want, err := docs.OpenAPIJSON()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || !bytes.Equal(b, want) {
		t.Fatalf("GET /v1/openapi.json: %d %s, %d bytes, want the %d bytes of docs/openapi.yaml as JSON",
			resp.StatusCode, resp.Header.Get("Content-Type"), len(b), len(want))
	}
	if !slices.Contains(strings.Split(resp.Header.Get("Cache-Control"), ", "), "public") {
		t.Errorf("Cache-Control %q: the description is the same for everyone", resp.Header.Get("Cache-Control"))
	}
	// A plain GET of the socket endpoint is the documented 426 (checked
	// against the description like every answer here).
	resp, err = http.Get(m.URL() + "/v1/realtime")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUpgradeRequired {
		t.Errorf("plain GET /v1/realtime: %d, want 426", resp.StatusCode)
	}
}
