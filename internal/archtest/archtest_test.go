package archtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/han-app/gateway/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{}, &env) }

// testHarness is the package every test package may import on top of the
// table.
const testHarness = "internal/testenv"

// rule is one row of the package table.
type rule struct {
	imports     []string // production imports allowed
	testImports []string // further imports allowed to _test.go files
}

// pkg is one package of the real import graph, paths relative to the module.
type pkg struct {
	path        string
	imports     []string
	testImports []string
	dir         string   // absolute folder
	goFiles     []string // non-test Go files of the build, names in dir
	testFiles   int      // _test.go files (in-package and external)
}

// moduleRoot is the directory of go.mod, found from the test's working
// directory (the package folder).
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test directory")
		}
		dir = parent
	}
}

// parseTable reads the table under "## Packages": one row per package, the
// first column a backticked package path, the third and fourth backticked
// import paths or "—".
func parseTable(r io.Reader) (map[string]rule, error) {
	table := map[string]rule{}
	sc := bufio.NewScanner(r)
	in := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "## ") {
			if in {
				break
			}
			in = line == "## Packages"
			continue
		}
		if !in || !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 4 {
			return nil, fmt.Errorf("package table row has %d columns, want 4: %s", len(cells), line)
		}
		names := backticked(cells[0])
		if len(names) == 0 {
			continue // header and separator rows
		}
		if len(names) != 1 {
			return nil, fmt.Errorf("package table row names %d packages, want 1: %s", len(names), line)
		}
		if _, dup := table[names[0]]; dup {
			return nil, fmt.Errorf("package %s has two rows", names[0])
		}
		table[names[0]] = rule{imports: backticked(cells[2]), testImports: backticked(cells[3])}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(table) == 0 {
		return nil, errors.New(`no package table under "## Packages"`)
	}
	return table, nil
}

// backticked returns the `quoted` words of a table cell.
func backticked(cell string) []string {
	parts := strings.Split(cell, "`")
	var out []string
	for i := 1; i < len(parts); i += 2 {
		out = append(out, strings.TrimSpace(parts[i]))
	}
	return out
}

// importGraph lists the module's packages with their project imports, split
// into production and test imports (a package's own external test package
// importing it is not an edge).
func importGraph(t *testing.T, root string) []pkg {
	t.Helper()
	run := func(args ...string) []byte {
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return out
	}
	module := strings.TrimSpace(string(run("list", "-m")))
	prefix := module + "/"
	rel := func(paths []string, self string) []string {
		var out []string
		for _, p := range paths {
			if r, ok := strings.CutPrefix(p, prefix); ok && r != self && !slices.Contains(out, r) {
				out = append(out, r)
			}
		}
		slices.Sort(out)
		return out
	}
	dec := json.NewDecoder(bytes.NewReader(run("list",
		"-json=ImportPath,Dir,GoFiles,TestGoFiles,XTestGoFiles,Imports,TestImports,XTestImports", "./...")))
	var graph []pkg
	for dec.More() {
		var p struct {
			ImportPath, Dir                    string
			GoFiles, TestGoFiles, XTestGoFiles []string
			Imports, TestImports, XTestImports []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("decoding go list output: %v", err)
		}
		path, ok := strings.CutPrefix(p.ImportPath, prefix)
		if !ok {
			t.Fatalf("package %s is outside module %s", p.ImportPath, module)
		}
		graph = append(graph, pkg{path: path, imports: rel(p.Imports, path),
			testImports: rel(append(p.TestImports, p.XTestImports...), path),
			dir:         p.Dir, goFiles: p.GoFiles, testFiles: len(p.TestGoFiles) + len(p.XTestGoFiles)})
	}
	return graph
}

// check returns one message per breach of the table by the graph.
func check(table map[string]rule, graph []pkg) []string {
	var bad []string
	exists := map[string]bool{}
	for _, p := range graph {
		exists[p.path] = true
	}
	for _, p := range graph {
		r, ok := table[p.path]
		if !ok {
			bad = append(bad, fmt.Sprintf("package %s is not in the package table of docs/architecture.md", p.path))
			continue
		}
		for _, imp := range p.imports {
			if !slices.Contains(r.imports, imp) {
				bad = append(bad, fmt.Sprintf("package %s imports %s, which the table does not allow", p.path, imp))
			}
		}
		for _, imp := range p.testImports {
			if imp != testHarness && !slices.Contains(r.imports, imp) && !slices.Contains(r.testImports, imp) {
				bad = append(bad, fmt.Sprintf("tests of package %s import %s, which the table does not allow", p.path, imp))
			}
		}
	}
	for path, r := range table {
		if !exists[path] {
			bad = append(bad, fmt.Sprintf("the package table lists %s, which is not a package of the module", path))
		}
		for _, imp := range append(slices.Clone(r.imports), r.testImports...) {
			if !exists[imp] {
				bad = append(bad, fmt.Sprintf("the row of %s allows %s, which is not a package of the module", path, imp))
			}
		}
	}
	slices.Sort(bad)
	return bad
}

func readTable(t *testing.T, root string) map[string]rule {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	table, err := parseTable(f)
	if err != nil {
		t.Fatalf("docs/architecture.md: %v", err)
	}
	return table
}

// TestImportsFollowThePackageTable is the rule itself: the real import graph
// stays inside the documented package map.
func TestImportsFollowThePackageTable(t *testing.T) {
	root := moduleRoot(t)
	table := readTable(t, root)
	graph := importGraph(t, root)
	for _, msg := range check(table, graph) {
		t.Error(msg)
	}
}

// TestCheckNamesEveryBreach feeds the real table a graph with breaches the
// repository does not have, so the rule is known to bite: a forbidden
// production import, a forbidden test import, a package missing from the
// table and a row for a package that is gone (cmd/hanctl: no row allows importing it).
func TestCheckNamesEveryBreach(t *testing.T) {
	root := moduleRoot(t)
	table := readTable(t, root)
	graph := importGraph(t, root)
	if len(check(table, graph)) > 0 {
		t.Skip("the real graph already breaks the table (see TestImportsFollowThePackageTable)")
	}
	for i := range graph {
		switch graph[i].path {
		case "store":
			graph[i].imports = append(graph[i].imports, "restapi")
		case "presence":
			graph[i].testImports = append(graph[i].testImports, "gateway")
		}
	}
	graph = slices.DeleteFunc(graph, func(p pkg) bool { return p.path == "cmd/hanctl" })
	graph = append(graph, pkg{path: "internal/unlisted"})

	got := check(table, graph)
	want := []string{
		"package internal/unlisted is not in the package table of docs/architecture.md",
		"package store imports restapi, which the table does not allow",
		"tests of package presence import gateway, which the table does not allow",
		"the package table lists cmd/hanctl, which is not a package of the module",
	}
	if !slices.Equal(got, want) {
		t.Errorf("check reported\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// TestParseTableRefusesAmbiguousRows keeps the table machine-readable: a row
// must name exactly one package in four columns, once, and the table must be
// there.
func TestParseTableRefusesAmbiguousRows(t *testing.T) {
	const head = "## Packages\n\n| package | job | may import | tests may also import |\n|---|---|---|---|\n"
	for name, doc := range map[string]string{
		"two packages in a row": head + "| `a` `b` | job | — | — |\n",
		"three columns":         head + "| `a` | job | — |\n",
		"duplicate row":         head + "| `a` | job | — | — |\n| `a` | job | — | — |\n",
		"no table":              "## Packages\n\nprose only\n",
	} {
		if _, err := parseTable(strings.NewReader(doc)); err == nil {
			t.Errorf("%s: parsed without error", name)
		}
	}
}
