//go:build ignore

// check-size lists the non-test Go files over the line limit and the
// functions over the function limit that its allow-list (read from stdin)
// does not name, and exits 1 when there is one. Run by scripts/check-size.sh.
//
// Allow-list lines: "<file glob> <reason>" allows a long file,
// "<file glob>:<Func> <reason>" a long function (methods as Recv.Method,
// function literals count toward the function that holds them). Blank lines
// and lines starting with # are ignored; an entry without a reason is an
// error, so every exception says why it stands.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

type entry struct {
	file, fn string
	used     bool
}

func main() {
	maxFile := flag.Int("file", 700, "most lines in a non-test Go file")
	maxFunc := flag.Int("func", 80, "most lines in a function")
	flag.Parse()

	allow, err := readAllow()
	if err != nil {
		fmt.Fprintln(os.Stderr, "check-size:", err)
		os.Exit(2)
	}
	var bad []string
	fset := token.NewFileSet()
	err = filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		p = filepath.ToSlash(p)
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if n := fset.File(f.Pos()).LineCount(); n > *maxFile && !allowed(allow, p, "") {
			bad = append(bad, fmt.Sprintf("%s: %d lines (limit %d)", p, n, *maxFile))
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			if name := funcName(fd); n > *maxFunc && !allowed(allow, p, name) {
				bad = append(bad, fmt.Sprintf("%s: func %s: %d lines (limit %d)", p, name, n, *maxFunc))
			}
		}
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "check-size:", err)
		os.Exit(2)
	}
	for _, e := range allow {
		if !e.used && !strings.ContainsAny(e.file, "*?[") {
			fmt.Fprintf(os.Stderr, "check-size: allow-list entry %s%s matches nothing over the limit; drop it\n", e.file, fnSuffix(e.fn))
		}
	}
	for _, b := range bad {
		fmt.Fprintln(os.Stderr, "check-size: over the limit, split it by concern or allow-list it with a reason:", b)
	}
	if len(bad) > 0 {
		os.Exit(1)
	}
}

func fnSuffix(fn string) string {
	if fn == "" {
		return ""
	}
	return ":" + fn
}

func readAllow() ([]*entry, error) {
	var out []*entry
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, reason, _ := strings.Cut(line, " ")
		if strings.TrimSpace(reason) == "" {
			return nil, fmt.Errorf("allow-list entry %q has no reason", key)
		}
		file, fn, _ := strings.Cut(key, ":")
		if _, err := path.Match(file, ""); err != nil {
			return nil, fmt.Errorf("allow-list entry %q: %v", key, err)
		}
		out = append(out, &entry{file: file, fn: fn})
	}
	return out, sc.Err()
}

// allowed reports whether an entry names file (fn == "") or fn in file.
func allowed(allow []*entry, file, fn string) bool {
	for _, e := range allow {
		if ok, _ := path.Match(e.file, file); ok && e.fn == fn {
			e.used = true
			return true
		}
	}
	return false
}

func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}
