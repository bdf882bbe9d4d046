package web

import (
	"embed"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
)

// The client's own files, and the JavaScript SDK's runtime modules (only
// web/sdk/*.js: its tests, examples, package files and node_modules stay
// out). The client imports the SDK from /sdk/, so each file exists once.
//
//go:embed static sdk/*.js
var embedded embed.FS

// csp allows only this origin's scripts and styles (ES modules, no inline
// script), images from blob: URLs (attachment previews are fetched, then
// shown from memory), and connections to this origin (its WebSocket
// endpoint included: 'self' matches ws: and wss: on the page's host and
// port) and to the realtime origin, when the deployment names one. No
// other host can be reached by a request or a WebSocket from the page,
// which is where an injected script would send a token.
func csp(realtimeOrigin string) string {
	connect := "'self'"
	if realtimeOrigin != "" {
		connect += " " + realtimeOrigin
	}
	return "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; " +
		"connect-src " + connect + "; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
}

// sourceOrigin is the scheme, host and port of a ws: or wss: URL as a CSP
// source expression, or "" for anything else (an empty or malformed URL,
// another scheme, a host with characters no host name has), which adds
// nothing to the policy.
func sourceOrigin(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
		return ""
	}
	for _, c := range u.Host {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune(".-:[]", c)) {
			return ""
		}
	}
	return u.Scheme + "://" + strings.ToLower(u.Host)
}

// Handler serves the embedded browser client. realtimeURL is the
// deployment's public WebSocket URL (HAN_PUBLIC_REALTIME_URL; empty when
// the client connects to this origin): its origin is the one other place
// the page may connect to. Files are revalidated on every load (no-cache)
// so a new deployment's modules are never mixed with an old cached one.
// Folders are not browsable: a directory other than the root (which serves
// index.html) is 404. No page of another origin may frame the client
// (frame-ancestors, and X-Frame-Options for browsers without CSP level 2),
// so none can lay it under its own and steer the user's clicks.
// Cross-Origin-Opener-Policy same-origin puts the page in a browsing
// context group of its own: a page of another origin that opened it, or
// that it opened, holds no reference to it, so cannot navigate it (to a
// sign-in link, say).
func Handler(realtimeURL string) http.Handler {
	fsrv := http.FileServer(http.FS(noDirs{Files()}))
	policy := csp(sourceOrigin(realtimeURL))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", policy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cache-Control", "no-cache")
		fsrv.ServeHTTP(w, r)
	})
}

// Files is the embedded client as served: the contents of web/static at
// the root and the SDK's modules under sdk/.
func Files() fs.FS {
	static, _ := fs.Sub(embedded, "static")
	sdk, _ := fs.Sub(embedded, "sdk")
	return clientFS{static: static, sdk: sdk}
}

// clientFS puts the SDK's directory at sdk/ beside the client's files.
type clientFS struct{ static, sdk fs.FS }

func (c clientFS) Open(name string) (fs.File, error) {
	if name == "sdk" {
		return c.sdk.Open(".")
	}
	if rest, ok := strings.CutPrefix(name, "sdk/"); ok {
		return c.sdk.Open(rest)
	}
	return c.static.Open(name)
}

// noDirs hides every directory but the root, which http.FileServer would
// otherwise answer with a listing of its files.
type noDirs struct{ fs.FS }

func (n noDirs) Open(name string) (fs.File, error) {
	f, err := n.FS.Open(name)
	if err != nil || name == "." {
		return f, err
	}
	st, err := f.Stat()
	if err != nil || st.IsDir() {
		_ = f.Close()
		return nil, fs.ErrNotExist
	}
	return f, nil
}
