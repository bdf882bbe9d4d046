// Package web embeds the browser client (static HTML, CSS and JavaScript in
// web/static) and serves it from the gateway binary. It has no state.
package web
