package lua

import (
	"context"
	"embed"
	"fmt"
	"sort"
	"strings"

	"github.com/redis/go-redis/v9"
)

//go:embed *.lua
var files embed.FS

// Script is one embedded Lua script. Run uses EVALSHA and falls back to EVAL
// on NOSCRIPT (after a restart or SCRIPT FLUSH), through go-redis's Script.
type Script struct {
	Name string
	// ReadOnly is true for scripts that declare flags=no-writes: they run
	// with EVALSHA_RO and keep working when Redis is out of memory.
	ReadOnly bool
	Source   string

	s *redis.Script
}

// Run executes the script. c may be a Client, ClusterClient, Pipeline or Tx.
func (s *Script) Run(ctx context.Context, c redis.Scripter, keys []string, args ...any) *redis.Cmd {
	if s.ReadOnly {
		return s.s.RunRO(ctx, c, keys, args...)
	}
	return s.s.Run(ctx, c, keys, args...)
}

// Load loads the script into c's script cache (SCRIPT LOAD).
func (s *Script) Load(ctx context.Context, c redis.Scripter) error {
	return s.s.Load(ctx, c).Err()
}

// Hash is the script's SHA1.
func (s *Script) Hash() string { return s.s.Hash() }

var registry = map[string]*Script{}

func mustLoad(name string) *Script {
	b, err := files.ReadFile(name + ".lua")
	if err != nil {
		panic(fmt.Sprintf("lua: missing script %s: %v", name, err))
	}
	src := string(b)
	first, _, _ := strings.Cut(src, "\n")
	if !strings.HasPrefix(first, "#!lua") {
		panic("lua: script " + name + " must start with a #!lua shebang")
	}
	s := &Script{Name: name, Source: src, ReadOnly: strings.Contains(first, "no-writes"), s: redis.NewScript(src)}
	registry[name] = s
	return s
}

// All returns every embedded script, sorted by name.
func All() []*Script {
	out := make([]*Script, 0, len(registry))
	for _, s := range registry {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// LoadAll loads every script (warm-up at start-up; Run reloads anyway).
func LoadAll(ctx context.Context, c redis.Scripter) error {
	for _, s := range All() {
		if err := s.Load(ctx, c); err != nil {
			return fmt.Errorf("load script %s: %w", s.Name, err)
		}
	}
	return nil
}

// Coordination locks: acquire with a fencing token, extend and release only
// by the owner. They are an optimisation: PostgreSQL row leases and unique
// constraints stay the real guard.
var (
	LockAcquire = mustLoad("lock_acquire")
	LockExtend  = mustLoad("lock_extend")
	LockRelease = mustLoad("lock_release")
)
