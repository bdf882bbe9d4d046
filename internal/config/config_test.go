package config

import (
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func base() map[string]string {
	return map[string]string{
		"REDIS_URL":                "redis://api_backend:pw@127.0.0.1:6379/0",
		"REDIS_REALTIME_URL":       "redis://api_backend:pw@127.0.0.1:6379/1",
		"DATABASE_URL":             "postgres://u@127.0.0.1/db",
		"HAN_HMAC_SECRET":          "0123456789abcdef",
		"HAN_JWT_DEV_HS256_SECRET": "0123456789abcdef0123456789abcdef",
	}
}

func TestDefaults(t *testing.T) {
	c, err := Load(env(base()))
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTPAddr != "127.0.0.1:8080" || c.Env != "dev" || c.RedisTimeout != time.Second || c.InstanceID == "" {
		t.Fatalf("defaults: %+v", c)
	}
	if !SameRedisInstance(c.RedisURL, c.RedisRealtimeURL) {
		t.Fatal("same host:port must count as one instance")
	}
}

func TestValidation(t *testing.T) {
	cases := []struct {
		name, key, value, want string
	}{
		{"prod refuses dev secret", "HAN_ENV", "prod", "HAN_JWT_DEV_HS256_SECRET: refused"},
		{"short dev secret", "HAN_JWT_DEV_HS256_SECRET", "Zq9marker-short", "at least 32 bytes"},
		{"bad redis scheme", "REDIS_URL", "http://x:Zq9marker@h/0", "REDIS_URL: must be a redis://"},
		{"missing realtime", "REDIS_REALTIME_URL", "", "REDIS_REALTIME_URL: required"},
		{"short hmac", "HAN_HMAC_SECRET", "Zq9marker", "HAN_HMAC_SECRET"},
		{"bad origin", "HAN_ALLOWED_ORIGINS", "chat.example.com", "HAN_ALLOWED_ORIGINS"},
		{"bad timeout", "HAN_REDIS_TIMEOUT", "-1s", "HAN_REDIS_TIMEOUT"},
		{"instance with brace", "HAN_INSTANCE_ID", "a{b}", "HAN_INSTANCE_ID"},
		{"log level", "HAN_LOG_LEVEL", "loud", "HAN_LOG_LEVEL"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := base()
			m[c.key] = c.value
			_, err := Load(env(m))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want error containing %q, got %v", c.want, err)
			}
			if strings.Contains(err.Error(), "Zq9marker") {
				t.Fatalf("error echoes a value: %v", err)
			}
		})
	}
	m := base()
	delete(m, "HAN_JWT_DEV_HS256_SECRET")
	if _, err := Load(env(m)); err == nil || !strings.Contains(err.Error(), "HAN_JWKS_URL") {
		t.Fatalf("no key source: %v", err)
	}
	m = base()
	m["HAN_ALLOWED_ORIGINS"] = "https://a.example, http://localhost:8080/"
	c, err := Load(env(m))
	if err != nil || len(c.AllowedOrigins) != 2 || c.AllowedOrigins[1] != "http://localhost:8080" {
		t.Fatalf("origins: %v %v", c.AllowedOrigins, err)
	}
}

func TestWSMaxConnsPerUser(t *testing.T) {
	m := base()
	if c, err := Load(env(m)); err != nil || c.WSMaxConnsPerUser != 16 {
		t.Fatalf("default: %d %v", c.WSMaxConnsPerUser, err)
	}
	m["HAN_WS_MAX_CONNS_PER_USER"] = "3"
	if c, err := Load(env(m)); err != nil || c.WSMaxConnsPerUser != 3 {
		t.Fatalf("set: %d %v", c.WSMaxConnsPerUser, err)
	}
	for _, v := range []string{"0", "-1", "many"} {
		m["HAN_WS_MAX_CONNS_PER_USER"] = v
		if _, err := Load(env(m)); err == nil || !strings.Contains(err.Error(), "HAN_WS_MAX_CONNS_PER_USER: must be a positive number") {
			t.Fatalf("%q: %v", v, err)
		}
	}
}

func TestDBRequestTimeout(t *testing.T) {
	m := base()
	if c, err := Load(env(m)); err != nil || c.DBRequestTimeout != 2*time.Second {
		t.Fatalf("default: %v %v", c.DBRequestTimeout, err)
	}
	m["HAN_DB_REQUEST_TIMEOUT"] = "500ms"
	if c, err := Load(env(m)); err != nil || c.DBRequestTimeout != 500*time.Millisecond {
		t.Fatalf("set: %v %v", c.DBRequestTimeout, err)
	}
	for _, v := range []string{"0", "-1s", "500us", "soon"} {
		m["HAN_DB_REQUEST_TIMEOUT"] = v
		if _, err := Load(env(m)); err == nil || !strings.Contains(err.Error(), "HAN_DB_REQUEST_TIMEOUT") {
			t.Fatalf("%q: %v", v, err)
		}
	}
}
