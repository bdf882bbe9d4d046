package main

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/gorilla/mux"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/restapi"
)

// Every path of the running program that answers GET answers HEAD (load
// balancers and uptime monitors probe with HEAD; it was 405 everywhere but
// the signed download): the routes the router matches by method and the
// project API, which dispatches by method itself and names HEAD in Allow.
func TestHeadIsServedOnEveryPathThatServesGet(t *testing.T) {
	m := start(t, baseEnv())
	tok := mintToken(t, ids.New())
	served := map[string][]string{} // methods by path template, over every route
	err := m.api.Router().Walk(func(route *mux.Route, _ *mux.Router, _ []*mux.Route) error {
		tpl, err := route.GetPathTemplate()
		if err != nil || route.GetHandler() == nil || route.GetName() == restapi.FallbackRouteName {
			return nil
		}
		ms, err := route.GetMethods()
		if err != nil { // dispatches by method itself
			ms = strings.Split(methodsOf(t, m, tok, routeVar.ReplaceAllString(tpl, ids.New())), ", ")
		}
		served[tpl] = append(served[tpl], ms...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	gets := 0
	for tpl, ms := range served {
		if !slices.Contains(ms, http.MethodGet) {
			continue
		}
		gets++
		if !slices.Contains(ms, http.MethodHead) {
			t.Errorf("%s serves GET (%v), not HEAD", tpl, ms)
		}
		path := routeVar.ReplaceAllString(tpl, ids.New())
		req, _ := http.NewRequest(http.MethodHead, m.URL()+path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusMethodNotAllowed {
			t.Errorf("HEAD %s: 405, Allow %q", path, resp.Header.Get("Allow"))
		}
	}
	if gets < 15 {
		t.Fatalf("the router walk found only %d paths served for GET", gets)
	}
}

// HEAD /v1/realtime is never a handshake: it answers what a GET that is no
// handshake answers (426 with Upgrade: websocket), without the body, even
// when it carries the upgrade headers.
func TestHeadOfTheWebSocketEndpointIsNoHandshake(t *testing.T) {
	m := start(t, baseEnv())
	ask := func(method string, hdr map[string]string) (*http.Response, []byte) {
		req, _ := http.NewRequest(method, m.URL()+"/v1/realtime", nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	get, _ := ask("GET", nil)
	if get.StatusCode != http.StatusUpgradeRequired {
		t.Fatalf("plain GET /v1/realtime: %d, want 426", get.StatusCode)
	}
	handshake := map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
		"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Origin": "http://localhost:8080"}
	for _, hdr := range []map[string]string{nil, handshake} {
		head, body := ask("HEAD", hdr)
		if head.StatusCode != get.StatusCode || len(body) != 0 || head.Header.Get("Upgrade") != get.Header.Get("Upgrade") ||
			head.Header.Get("Content-Type") != get.Header.Get("Content-Type") {
			t.Errorf("HEAD /v1/realtime with %v: %d %q, Upgrade %q, Content-Type %q; want GET's %d, Upgrade %q, Content-Type %q, no body",
				hdr, head.StatusCode, body, head.Header.Get("Upgrade"), head.Header.Get("Content-Type"),
				get.StatusCode, get.Header.Get("Upgrade"), get.Header.Get("Content-Type"))
		}
	}
}
