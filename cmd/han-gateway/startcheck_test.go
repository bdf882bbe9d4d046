package main

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/han-app/gateway/internal/testenv"
)

// HAN_DEBUG_ENDPOINTS is read as the other booleans are (strconv.ParseBool):
// it was read as exactly "1", so "true" (how HAN_LEGACY_STUB_ENABLED is
// written) left the endpoints off without a word. A value that is no
// boolean is refused naming the variable.
func TestDebugEndpointsIsABoolean(t *testing.T) {
	for v, want := range map[string]bool{"": false, "1": true, "true": true, "TRUE": true, "t": true, "0": false, "false": false} {
		vars := baseEnv()
		vars["HAN_DEBUG_ENDPOINTS"] = v
		m := NewMain()
		if err := m.ParseFlags(nil, func(k string) string { return vars[k] }); err != nil || m.Debug != want {
			t.Errorf("HAN_DEBUG_ENDPOINTS=%q: debug %v, %v; want %v", v, m.Debug, err, want)
		}
	}
	for _, v := range []string{"yes", "on", "2", "true\r"} {
		vars := baseEnv()
		vars["HAN_DEBUG_ENDPOINTS"] = v
		err := NewMain().ParseFlags(nil, func(k string) string { return vars[k] })
		if err == nil || !strings.Contains(err.Error(), "HAN_DEBUG_ENDPOINTS") {
			t.Errorf("HAN_DEBUG_ENDPOINTS=%q: %v, want a refusal naming it", v, err)
		}
	}
	// The flag still overrides the environment.
	vars := baseEnv()
	vars["HAN_DEBUG_ENDPOINTS"] = "true"
	m := NewMain()
	if err := m.ParseFlags([]string{"-debug-endpoints=false"}, func(k string) string { return vars[k] }); err != nil || m.Debug {
		t.Errorf("-debug-endpoints=false over HAN_DEBUG_ENDPOINTS=true: debug %v, %v", m.Debug, err)
	}
}

// A start-up that cannot reach PostgreSQL names the variable and the
// error's kind, never the URL's parts: pgx's error quotes the user, host
// and database, and a password written with an unencoded '/' ends up as
// the database name. Such a URL is refused before any connection.
func TestStartupDatabaseErrorsQuoteNothingOfTheURL(t *testing.T) {
	const tail = "Zq9SecretTail"
	for _, c := range []struct{ name, url string }{
		{"DATABASE_URL", "postgres://han:4/" + tail + "@127.0.0.1:5432/db"},
		// Accepted by the configuration; the port is closed.
		{"DATABASE_URL", "postgres://user" + tail + ":pw" + tail + "@127.0.0.1:1/db" + tail + "?connect_timeout=2"},
	} {
		vars := baseEnv()
		vars[c.name] = c.url
		m := NewMain()
		err := m.ParseFlags(nil, func(k string) string { return vars[k] })
		if err == nil {
			m.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
			err = m.Run(context.Background())
			_ = m.Close()
		}
		if err == nil {
			t.Fatalf("%s=%s: started", c.name, c.url)
		}
		if strings.Contains(err.Error(), tail) || strings.Contains(err.Error(), "127.0.0.1") {
			t.Errorf("%s: the start-up error quotes the URL: %v", c.name, err)
		}
		if !strings.Contains(err.Error(), c.name) {
			t.Errorf("%s: the start-up error does not name the variable: %v", c.name, err)
		}
	}
}

// A production instance logs a warning at start for the debug endpoints
// and for a trusted proxy range that covers every address (any client may
// then name its own address, which lifts the per-address caps), and
// lowers HAN_SEND_COMMITTERS above the PostgreSQL pool to the pool size,
// with a warning; a non-production one warns only of the committers.
func TestStartWarnings(t *testing.T) {
	pub, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	jwks := filepath.Join(t.TempDir(), "jwks.json")
	doc := `{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"k1","x":"` + base64.RawURLEncoding.EncodeToString(pub) + `"}]}`
	if err := os.WriteFile(jwks, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, envName := range []string{"prod", "dev"} {
		vars := baseEnv()
		vars["HAN_ENV"], vars["HAN_JWKS_FILE"], vars["HAN_PUBLIC_REALTIME_URL"] = envName, jwks, "wss://rt.example.com/v1/realtime"
		delete(vars, "HAN_JWT_DEV_HS256_SECRET")
		vars["HAN_DEBUG_ENDPOINTS"], vars["HAN_TRUSTED_PROXIES"] = "true", "10.0.0.0/8,0.0.0.0/0,::/0"
		vars["DATABASE_URL"] = env.DatabaseURL + sep(env.DatabaseURL) + "pool_max_conns=4"
		vars["HAN_SEND_COMMITTERS"] = "8"
		m := NewMain()
		if err := m.ParseFlags(nil, func(k string) string { return vars[k] }); err != nil {
			t.Fatal(err)
		}
		var log testenv.LogBuffer
		m.Logger = slog.New(slog.NewJSONHandler(&log, nil))
		if err := m.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		_ = m.Close()
		warnings := map[string]bool{} // the warnings about a setting, by its name
		for _, l := range strings.Split(log.String(), "\n") {
			var line struct{ Level, Msg, Prefix string }
			if json.Unmarshal([]byte(l), &line) == nil && line.Level == "WARN" && strings.HasPrefix(line.Msg, "HAN_") {
				warnings[strings.Fields(line.Msg)[0]+" "+line.Prefix] = true
			}
		}
		want := map[string]bool{"HAN_SEND_COMMITTERS ": true}
		if envName == "prod" {
			want["HAN_DEBUG_ENDPOINTS "], want["HAN_TRUSTED_PROXIES 0.0.0.0/0"], want["HAN_TRUSTED_PROXIES ::/0"] = true, true, true
		}
		if !maps.Equal(warnings, want) {
			t.Errorf("HAN_ENV=%s: warnings %v, want %v", envName, warnings, want)
		}
	}
}

// sep is the separator before one more query parameter of u.
func sep(u string) string {
	if strings.Contains(u, "?") {
		return "&"
	}
	return "?"
}
