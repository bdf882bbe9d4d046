package config

import (
	"strings"
	"testing"
	"time"
)

// HAN_IDEMPOTENCY_TTL goes to Redis and PostgreSQL in whole milliseconds:
// a duration under a millisecond would be none (the Redis record deleted as
// it is written, the PostgreSQL one born expired) and idempotency would be
// off without a word. Load refuses anything under a second, and names the
// variable.
func TestIdempotencyTTLUnderASecondIsRefused(t *testing.T) {
	for _, v := range []string{"500us", "999ms"} {
		m := base()
		m["HAN_IDEMPOTENCY_TTL"] = v
		c, err := Load(env(m))
		if err == nil || !strings.Contains(err.Error(), "HAN_IDEMPOTENCY_TTL") {
			t.Fatalf("HAN_IDEMPOTENCY_TTL=%s: IdempotencyTTL=%v, err %v", v, c.IdempotencyTTL, err)
		}
	}
	m := base()
	m["HAN_IDEMPOTENCY_TTL"] = "1s"
	if c, err := Load(env(m)); err != nil || c.IdempotencyTTL != time.Second {
		t.Fatalf("HAN_IDEMPOTENCY_TTL=1s: %v %v", c.IdempotencyTTL, err)
	}
}
