package web

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed static
var static embed.FS

// csp allows only this origin's scripts and styles (ES modules, no inline
// script), images from blob: URLs (attachment previews are fetched, then
// shown from memory) and WebSocket connections.
const csp = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; " +
	"connect-src 'self' ws: wss:; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// Handler serves the embedded browser client. Files are revalidated on
// every load (no-cache) so a new deployment's modules are never mixed with
// an old cached one.
func Handler() http.Handler {
	fsrv := http.FileServer(http.FS(Files()))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		fsrv.ServeHTTP(w, r)
	})
}

// Files is the embedded client (the contents of web/static).
func Files() fs.FS {
	sub, _ := fs.Sub(static, "static")
	return sub
}
