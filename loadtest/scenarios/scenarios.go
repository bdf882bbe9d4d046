package scenarios

import (
	"flag"
	"fmt"
	"sort"
	"strings"

	"github.com/han-app/gateway/loadtest"
)

// Scenario is a runnable load test with its own command-line flags.
type Scenario interface {
	loadtest.Scenario
	// Describe is one line for `han-loadtest scenarios`.
	Describe() string
	// Flags registers the scenario's flags on fs; getenv supplies defaults
	// from the environment (the dev secret, the Redis URL).
	Flags(fs *flag.FlagSet, getenv func(string) string)
}

var registry = map[string]func() Scenario{
	"broadcast":        func() Scenario { return &Broadcast{} },
	"idle-connections": func() Scenario { return &Idle{} },
	"chat-fanout":      func() Scenario { return &ChatFanout{} },
	"send-sql":         func() Scenario { return &SendSQL{} },
	"connect-storm":    func() Scenario { return &ConnectStorm{} },
	"rate-limit":       func() Scenario { return &RateLimit{} },
	"project-queue":    func() Scenario { return &ProjectQueue{} },
	"soak":             func() Scenario { return &Soak{} },
}

// New returns a fresh scenario by name.
func New(name string) (Scenario, error) {
	f, ok := registry[name]
	if !ok {
		return nil, fmt.Errorf("unknown scenario %q (have: %s)", name, strings.Join(Names(), ", "))
	}
	return f(), nil
}

// Names lists the scenarios, sorted.
func Names() []string {
	out := make([]string, 0, len(registry))
	for n := range registry {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
