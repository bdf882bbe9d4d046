package archtest

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

// pgDriver is the path prefix of the PostgreSQL driver (pgx and its parts).
const pgDriver = "github.com/jackc/"

// driverRule keeps the PostgreSQL driver out of a package: linked means no
// transitive dependency of its production build may be the driver (the
// realtime packages use Redis only, so they must not carry PostgreSQL);
// otherwise only its own imports are checked (the HTTP layer reaches
// PostgreSQL through the store and never holds a connection or a
// transaction itself). docs/architecture.md states the same rules.
type driverRule struct {
	pattern string // go list pattern, relative to the module
	linked  bool
}

var driverRules = []driverRule{
	{"./presence", true},
	{"./ratelimit", true},
	{"./pubsub", true},
	{"./store/rds", true},
	{"./store/project", true},
	{"./restapi/...", false},
}

// driverBreaches returns one message per driver path in paths, which are
// what pattern links (linked) or imports.
func driverBreaches(r driverRule, pkgPath string, paths []string) []string {
	var bad []string
	for _, p := range paths {
		if strings.HasPrefix(p, pgDriver) {
			how := "imports"
			if r.linked {
				how = "links"
			}
			bad = append(bad, fmt.Sprintf("%s %s %s, but must not reach the PostgreSQL driver", pkgPath, how, p))
		}
	}
	return bad
}

// TestPostgresDriverStaysInTheStore: presence, ratelimit, pubsub, the
// Redis plumbing and the project Redis API's data link no PostgreSQL driver,
// and no restapi package imports it.
func TestPostgresDriverStaysInTheStore(t *testing.T) {
	root := moduleRoot(t)
	for _, r := range driverRules {
		format := `{{.ImportPath}} {{join .Imports " "}}`
		args := []string{"list", "-f", format, r.pattern}
		if r.linked {
			args = []string{"list", "-deps", "-f", "{{.ImportPath}}", r.pattern}
		}
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if r.linked {
			for _, msg := range driverBreaches(r, r.pattern, lines) {
				t.Error(msg)
			}
			continue
		}
		for _, line := range lines {
			f := strings.Fields(line)
			for _, msg := range driverBreaches(r, f[0], f[1:]) {
				t.Error(msg)
			}
		}
	}
}

// TestDriverCheckNamesEveryBreach: the rule bites on a link and on an
// import of any part of the driver, and lets everything else through.
func TestDriverCheckNamesEveryBreach(t *testing.T) {
	got := driverBreaches(driverRule{"./pubsub", true}, "./pubsub",
		[]string{"context", "github.com/redis/go-redis/v9", "github.com/jackc/pgx/v5/pgconn", "github.com/jackc/puddle/v2"})
	got = append(got, driverBreaches(driverRule{"./restapi/...", false}, "restapi", []string{"github.com/jackc/pgx/v5", "net/http"})...)
	want := []string{
		"./pubsub links github.com/jackc/pgx/v5/pgconn, but must not reach the PostgreSQL driver",
		"./pubsub links github.com/jackc/puddle/v2, but must not reach the PostgreSQL driver",
		"restapi imports github.com/jackc/pgx/v5, but must not reach the PostgreSQL driver",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("breaches:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
