package lua

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"

	"github.com/redis/go-redis/v9"
)

//go:embed *.lua project/*.lua project/lib/*.lua
var files embed.FS

// includeMarker starts a script line that compose replaces with the text of
// the fragment lib/<name>.lua in the script's own folder. A fragment defines local functions that take
// their keys as arguments, so the script passes its own KEYS and stays on its
// one hash tag.
const includeMarker = "--#include "

// Script is one embedded Lua script. Run uses EVALSHA and falls back to EVAL
// on NOSCRIPT (after a restart or SCRIPT FLUSH), through go-redis's Script.
type Script struct {
	Name string
	// ReadOnly is true for scripts that declare flags=no-writes: they run
	// with EVALSHA_RO and keep working when Redis is out of memory.
	ReadOnly bool
	// Source is the text sent to Redis: the script file with its fragments
	// composed in. The same files always compose to the same text, so the
	// SHA stays the same across restarts and instances.
	Source string

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
	src, err := compose(files, name)
	if err != nil {
		panic("lua: " + err.Error())
	}
	first, _, _ := strings.Cut(src, "\n")
	if !strings.HasPrefix(first, "#!lua") {
		panic("lua: script " + name + " must start with a #!lua shebang")
	}
	s := &Script{Name: name, Source: src, ReadOnly: strings.Contains(first, "no-writes"), s: redis.NewScript(src)}
	registry[name] = s
	return s
}

// compose returns the script name.lua of fsys with every include line
// replaced, in place, by its fragment from the lib/ folder next to the script
// (the project scripts' fragments are theirs alone, in project/lib/). Any other line starting with
// "--#" is refused (a mistyped include would otherwise load as a comment and
// fail only when Redis runs the script), as are a fragment included twice and
// a fragment that includes another: one level keeps the composed text easy to
// read next to its files.
func compose(fsys fs.FS, name string) (string, error) {
	b, err := fs.ReadFile(fsys, name+".lua")
	if err != nil {
		return "", fmt.Errorf("missing script %s: %w", name, err)
	}
	var out strings.Builder
	included := map[string]bool{}
	for line := range strings.Lines(string(b)) {
		if !strings.HasPrefix(line, "--#") {
			out.WriteString(line)
			continue
		}
		frag, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), includeMarker)
		if !ok {
			return "", fmt.Errorf("script %s: unknown directive %q", name, strings.TrimSpace(line))
		}
		if included[frag] {
			return "", fmt.Errorf("script %s includes %s twice", name, frag)
		}
		included[frag] = true
		text, err := fs.ReadFile(fsys, fragmentPath(name, frag))
		if err != nil {
			return "", fmt.Errorf("script %s: missing fragment %s: %w", name, frag, err)
		}
		if !strings.HasSuffix(string(text), "\n") {
			return "", fmt.Errorf("fragment %s must end with a newline", frag)
		}
		for l := range strings.Lines(string(text)) {
			if strings.HasPrefix(l, "--#") {
				return "", fmt.Errorf("fragment %s may not hold a directive", frag)
			}
		}
		out.Write(text)
	}
	return out.String(), nil
}

// fragmentPath is lib/<frag>.lua in the folder of the script name. It is not
// cleaned, so an include naming ".." stays an invalid fs path and is refused
// instead of reaching outside lib/.
func fragmentPath(name, frag string) string {
	if dir := path.Dir(name); dir != "." {
		return dir + "/lib/" + frag + ".lua"
	}
	return "lib/" + frag + ".lua"
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
