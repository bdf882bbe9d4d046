package lua

import (
	"crypto/sha1"
	"encoding/hex"
	"io/fs"
	"path"
	"strings"
	"testing"
	"testing/fstest"
)

// The SHA Redis caches a script under must not change between two starts of
// the service: composing a script again gives the text it was loaded with,
// and no include line reaches Redis.
func TestComposedScriptsAreStable(t *testing.T) {
	composed := 0
	for _, s := range All() {
		again, err := compose(files, s.Name)
		if err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		if again != s.Source {
			t.Errorf("%s: composing twice gave different texts", s.Name)
		}
		sum := sha1.Sum([]byte(s.Source))
		if s.Hash() != hex.EncodeToString(sum[:]) {
			t.Errorf("%s: Hash is not the SHA1 of the composed text", s.Name)
		}
		for line := range strings.Lines(s.Source) {
			if strings.HasPrefix(line, "--#") {
				t.Errorf("%s: composed text still holds %q", s.Name, strings.TrimSpace(line))
			}
		}
		raw, err := files.ReadFile(s.Name + ".lua")
		if err != nil {
			t.Fatal(err)
		}
		if string(raw) != s.Source {
			composed++
		}
	}
	if composed == 0 {
		t.Fatal("no script composes a fragment")
	}
}

// The shared text lives once: the function a fragment defines appears in no
// script file, only in the composed texts of the scripts that include it.
func TestFragmentsAreNotCopied(t *testing.T) {
	frags, err := fs.Glob(files, "*/lib/*.lua")
	if err != nil || len(frags) == 0 {
		t.Fatalf("no fragments: %v", err)
	}
	top, err := fs.Glob(files, "*.lua")
	if err != nil {
		t.Fatal(err)
	}
	nested, err := fs.Glob(files, "*/*.lua")
	if err != nil {
		t.Fatal(err)
	}
	scripts := append(top, nested...)
	for _, f := range frags {
		text, _ := files.ReadFile(f)
		_, def, ok := strings.Cut(string(text), "\nlocal function ")
		if !ok {
			t.Fatalf("%s defines no local function", f)
		}
		def, _, _ = strings.Cut(def, "(")
		name := strings.TrimSuffix(path.Base(f), ".lua")
		users := 0
		for _, p := range scripts {
			raw, _ := files.ReadFile(p)
			if strings.Contains(string(raw), "local function "+def+"(") {
				t.Errorf("%s copies %s instead of including %s", p, def, name)
			}
			if !strings.Contains(string(raw), includeMarker+name+"\n") {
				continue
			}
			users++
			s := registry[strings.TrimSuffix(p, ".lua")]
			if s == nil || strings.Count(s.Source, "local function "+def+"(") != 1 {
				t.Errorf("%s: composed text must define %s once", p, def)
			}
		}
		if users == 0 {
			t.Errorf("fragment %s is included by no script", f)
		}
	}
}

func TestComposeRefusesBadIncludes(t *testing.T) {
	fsys := fstest.MapFS{
		"lib/a.lua":      {Data: []byte("local function a() end\n")},
		"lib/nested.lua": {Data: []byte("--#include a\n")},
		"lib/open.lua":   {Data: []byte("local function o() end")},
		"ok.lua":         {Data: []byte("#!lua\n-- KEYS[1] k\n--#include a\nreturn a()\n")},
		"typo.lua":       {Data: []byte("#!lua\n--#incldue a\n")},
		"missing.lua":    {Data: []byte("#!lua\n--#include b\n")},
		"twice.lua":      {Data: []byte("#!lua\n--#include a\n--#include a\n")},
		"nested.lua":     {Data: []byte("#!lua\n--#include nested\n")},
		"open.lua":       {Data: []byte("#!lua\n--#include open\nreturn 1\n")},
		"escape.lua":     {Data: []byte("#!lua\n--#include ../ok\n")},
	}
	got, err := compose(fsys, "ok")
	if err != nil || got != "#!lua\n-- KEYS[1] k\nlocal function a() end\nreturn a()\n" {
		t.Fatalf("compose ok: %q, %v", got, err)
	}
	for _, name := range []string{"typo", "missing", "twice", "nested", "open", "escape", "absent"} {
		if got, err := compose(fsys, name); err == nil {
			t.Errorf("%s: composed to %q, want an error", name, got)
		}
	}
}
