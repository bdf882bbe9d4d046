package apicheck

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/han-app/gateway/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{}, &env) }

// The check catches what a client would trip on: a body off its schema, an
// error code the route does not list, a status the route does not
// document; it passes a conforming answer through intact and ignores paths
// the description does not name.
func TestTransport(t *testing.T) {
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	answers := map[string]struct {
		status int
		body   string
	}{
		"/healthz":                      {200, `{"status":"ok"}`},
		"/readyz":                       {200, `{"status":"fine","checks":{}}`},
		"/v1/me":                        {404, `{"error":"dialog_not_found"}`},
		"/v1/dialogs":                   {418, `{"error":"teapot"}`},
		"/v1/public/config":             {200, `{"realtimeUrl":null,"limits":{"x":1},"version":"dev"}`},
		"/metrics":                      {200, `not json`},
		"/v1/realtime/tickets":          {201, `{"ticket":"t","expiresAt":"soon"}`},
		"/v1/users/not-a-uuid/presence": {400, `{"error":"invalid_uuid"}`},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a := answers[r.URL.Path]
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.status)
		_, _ = io.WriteString(w, a.body)
	}))
	defer srv.Close()
	client := &http.Client{Transport: c.Transport(http.DefaultTransport)}
	for path, wantOK := range map[string]bool{"/healthz": true, "/readyz": false, "/v1/me": false, "/v1/dialogs": false,
		"/v1/public/config": true, "/metrics": true, "/v1/realtime/tickets": false, "/v1/users/not-a-uuid/presence": true} {
		method := "GET"
		if path == "/v1/realtime/tickets" {
			method = "POST"
		}
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		resp, err := client.Do(req)
		if wantOK {
			if err != nil {
				t.Errorf("%s: %v", path, err)
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != answers[path].body {
				t.Errorf("%s: body %q, want it intact", path, b)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "does not match docs/openapi.yaml") {
			t.Errorf("%s: %v, want a mismatch", path, err)
		}
	}
	if err := c.Err(); err == nil || !strings.Contains(err.Error(), "4 of 7 answers") {
		t.Errorf("Err: %v", err)
	}
}
