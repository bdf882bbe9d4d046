package config

import (
	"strings"
	"testing"
)

// HAN_HTTP_ADDR and HAN_METRICS_ADDR are checked when the configuration
// is read, each refusal naming its variable: a value with a trailing space
// (an env file) or no port, and a metrics address equal to the API's,
// used to pass here and fail later in start-up as "listen: listen tcp …:
// address already in use" (the metrics listener binds first, so the
// error blamed the API's address), after the migrations had run.
func TestListenAddresses(t *testing.T) {
	for _, tc := range []struct {
		http, metrics, want string
	}{
		{"127.0.0.1:8080 ", "", "HAN_HTTP_ADDR (or -addr): must be"},
		{"127.0.0.1", "", "HAN_HTTP_ADDR (or -addr): must be"},
		{"127.0.0.1:80800", "", "HAN_HTTP_ADDR (or -addr): must be"},
		{"127.0.0.1:8080\x00", "", "HAN_HTTP_ADDR (or -addr): must be"},
		{"", "127.0.0.1:9090 ", "HAN_METRICS_ADDR: must be"},
		{"", "127.0.0.1:8080", "HAN_METRICS_ADDR: must differ from HAN_HTTP_ADDR"},
		{"0.0.0.0:8080", ":8080", "HAN_METRICS_ADDR: must differ from HAN_HTTP_ADDR"},
		{":8080", "127.0.0.1:8080", "HAN_METRICS_ADDR: must differ from HAN_HTTP_ADDR"},
	} {
		m := base()
		if tc.http != "" {
			m["HAN_HTTP_ADDR"] = tc.http
		}
		m["HAN_METRICS_ADDR"] = tc.metrics
		_, err := Load(env(m))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("HAN_HTTP_ADDR %q, HAN_METRICS_ADDR %q: %v, want %q", tc.http, tc.metrics, err, tc.want)
		}
	}
	for _, tc := range []struct{ http, metrics string }{
		{"127.0.0.1:0", "127.0.0.1:0"}, // two free ports
		{"127.0.0.1:8080", "127.0.0.1:9090"},
		{"[::1]:8080", "127.0.0.1:8080"},
		{":8080", ""},
		{"localhost:8080", "10.0.0.5:8080"},
	} {
		m := base()
		m["HAN_HTTP_ADDR"], m["HAN_METRICS_ADDR"] = tc.http, tc.metrics
		if _, err := Load(env(m)); err != nil {
			t.Errorf("HAN_HTTP_ADDR %q, HAN_METRICS_ADDR %q: %v", tc.http, tc.metrics, err)
		}
	}
}
