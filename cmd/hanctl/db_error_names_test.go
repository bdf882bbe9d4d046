package main

import (
	"strings"
	"testing"
)

// A malformed HAN_DATABASE_DIRECT_URL is reported under its own name
// (DATABASE_URL is fine here), never quoting the URL.
func TestMalformedDirectURLIsNamed(t *testing.T) {
	_, err := run(t, map[string]string{
		"DATABASE_URL":            env.DatabaseURL,
		"HAN_DATABASE_DIRECT_URL": "postgres://han:Zq9Secret@127.0.0.1:notaport/han",
	}, "migrate")
	if err == nil || !strings.Contains(err.Error(), "HAN_DATABASE_DIRECT_URL") || strings.Contains(err.Error(), " DATABASE_URL") {
		t.Fatalf("migrate with a malformed HAN_DATABASE_DIRECT_URL: %v, want an error naming HAN_DATABASE_DIRECT_URL (and not DATABASE_URL)", err)
	}
	if strings.Contains(err.Error(), "Zq9Secret") || strings.Contains(err.Error(), "127.0.0.1") {
		t.Fatalf("the error quotes the URL: %v", err)
	}
}

// A server that answers but refuses the connection (here: no such
// database) is reported as a refusal with its kind, as the gateway's own
// start-up does, not as a server out of reach: the operator looks for the
// right problem. The variable is the one the URL came from; the server's
// text (which quotes the database name) is not shown.
func TestRefusedConnectionNamesItsKind(t *testing.T) {
	u := strings.Replace(env.DatabaseURL, "/"+dbName(env.DatabaseURL), "/no_such_db_hanctl", 1)
	for _, name := range []string{"DATABASE_URL", "HAN_DATABASE_DIRECT_URL"} {
		_, err := run(t, map[string]string{name: u}, "migrate")
		if err == nil || strings.Contains(err.Error(), "cannot reach") || !strings.Contains(err.Error(), "(pg:3D000") ||
			!strings.Contains(err.Error(), name) {
			t.Fatalf("migrate over %s to a database that does not exist: %v, want a refusal naming %s and its kind (pg:3D000)",
				name, err, name)
		}
		if strings.Contains(err.Error(), "no_such_db_hanctl") {
			t.Fatalf("the error quotes the server's text: %v", err)
		}
	}
	// Nothing answers: out of reach, with the network error's kind.
	_, err := run(t, map[string]string{"DATABASE_URL": "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"}, "migrate")
	if err == nil || !strings.Contains(err.Error(), "cannot reach PostgreSQL at DATABASE_URL (") {
		t.Fatalf("migrate with nothing listening: %v, want \"cannot reach PostgreSQL at DATABASE_URL (kind)\"", err)
	}
}

func dbName(u string) string {
	s := u
	if i := strings.IndexByte(s, '?'); i >= 0 {
		s = s[:i]
	}
	return s[strings.LastIndexByte(s, '/')+1:]
}
