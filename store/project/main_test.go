package project_test

import (
	"testing"

	"github.com/han-app/gateway/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{Redis: true}, &env)
}
