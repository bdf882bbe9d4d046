package loadtest_test

import (
	"testing"

	"github.com/han-app/gateway/internal/testenv"
)

var env *testenv.Env

// TestMain runs goleak after the tests: every executor, connection and
// server the tests start must be gone. No Redis or PostgreSQL is needed.
func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{}, &env)
}
