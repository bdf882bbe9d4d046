package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// metricsListener serves /metrics on its own address (HAN_METRICS_ADDR), so
// the scrape port can stay on a private interface while the API is public.
type metricsListener struct {
	addr string // bound address; empty when not serving
	srv  *http.Server
	errc chan error
}

// start serves h on addr. Connections idle for idle (HAN_HTTP_IDLE_TIMEOUT)
// are closed, as on the API port: the connections of this listener count
// against no cap, and kept open they would hold descriptors for ever.
func (l *metricsListener) start(addr string, h http.Handler, idle time.Duration, logger *slog.Logger) error {
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("HAN_METRICS_ADDR: listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	l.addr = ln.Addr().String()
	l.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: idle, MaxHeaderBytes: 64 << 10,
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	l.errc = make(chan error, 1)
	go func() { l.errc <- l.srv.Serve(ln) }()
	logger.Info("serving metrics", slog.String("addr", l.addr))
	return nil
}

// close waits for the scrapes under way within ctx. It is idempotent.
func (l *metricsListener) close(ctx context.Context) error {
	if l.srv == nil {
		return nil
	}
	err := l.srv.Shutdown(ctx)
	if serr := <-l.errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	l.srv = nil
	return err
}

// MetricsAddr is the bound metrics address ("" when /metrics is served on
// the main listener). The tests read it to scrape a separate metrics
// listener.
func (m *Main) MetricsAddr() string { return m.metrics.addr }
