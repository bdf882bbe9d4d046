package archtest

import (
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Tests in their place: a package's tests check that package. The tests
// that need the whole server (REST API, gateway and Pub/Sub together) live
// in cmd/han-gateway, which runs the real program; the REST API's own
// tests live in the restapi tree. No other package's tests build the REST
// API, and no folder exists only to hold tests.

// restapiPkg is the REST API, relative to the module.
const restapiPkg = "restapi"

// mayTestRESTAPI reports whether the tests of the package at path may
// import the REST API: the program's end-to-end tests and the REST API's
// own tree.
func mayTestRESTAPI(path string) bool {
	return path == "cmd/han-gateway" || path == restapiPkg || strings.HasPrefix(path, restapiPkg+"/")
}

// testOnlyAllowed are the packages whose job is a test (their doc.go says
// so): internal/archtest checks the repository as a whole, and cluster runs
// the code of several packages on a Redis Cluster it starts once, so each
// belongs beside none of the packages it checks.
var testOnlyAllowed = []string{"internal/archtest", "internal/clustertest"}

// declaresCode reports whether any of files (names in dir) declares
// something beyond its package clause and comments.
func declaresCode(dir string, files []string) (bool, error) {
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return false, err
		}
		if len(f.Decls) > 0 {
			return true, nil
		}
	}
	return false, nil
}

// placeBreaches returns one message per breach of the rule above.
func placeBreaches(graph []pkg) ([]string, error) {
	var bad []string
	for _, p := range graph {
		if slices.Contains(p.testImports, restapiPkg) && !mayTestRESTAPI(p.path) {
			bad = append(bad, fmt.Sprintf("tests of package %s import %s: tests that need the whole server belong in cmd/han-gateway", p.path, restapiPkg))
		}
		if p.testFiles == 0 || slices.Contains(testOnlyAllowed, p.path) {
			continue
		}
		code, err := declaresCode(p.dir, p.goFiles)
		if err != nil {
			return nil, fmt.Errorf("package %s: %w", p.path, err)
		}
		if !code {
			bad = append(bad, fmt.Sprintf("folder %s holds only tests: move each test to the package whose behaviour it checks", p.path))
		}
	}
	slices.Sort(bad)
	return bad, nil
}

// TestTestsLiveWithWhatTheyCheck is the rule itself, on the real module.
func TestTestsLiveWithWhatTheyCheck(t *testing.T) {
	bad, err := placeBreaches(importGraph(t, moduleRoot(t)))
	if err != nil {
		t.Fatal(err)
	}
	for _, msg := range bad {
		t.Error(msg)
	}
}

// TestPlaceBreachesBite feeds the check a graph with the breaches the
// module does not have: a lower package whose tests import the REST API,
// and a folder of tests with only a doc.go (and one with no non-test file
// at all); the REST API's tree and the program's end-to-end tests stay
// allowed.
func TestPlaceBreachesBite(t *testing.T) {
	onlyDoc, empty, code := t.TempDir(), t.TempDir(), t.TempDir()
	write := func(dir, name, src string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(onlyDoc, "doc.go", "// Package faults holds tests.\npackage faults\n")
	write(code, "doc.go", "// Package real does something.\npackage real\n")
	write(code, "real.go", "package real\n\n// Do does it.\nfunc Do() {}\n")
	graph := []pkg{
		{path: "gateway", testImports: []string{"restapi", "store"}, dir: code, goFiles: []string{"doc.go", "real.go"}, testFiles: 1},
		{path: "cmd/han-gateway", testImports: []string{"restapi"}, dir: code, goFiles: []string{"real.go"}, testFiles: 1},
		{path: "restapi/project", testImports: []string{"restapi"}, dir: code, goFiles: []string{"real.go"}, testFiles: 1},
		{path: "faults", dir: onlyDoc, goFiles: []string{"doc.go"}, testFiles: 2},
		{path: "faults/more", dir: empty, testFiles: 1},
		{path: "internal/archtest", dir: onlyDoc, goFiles: []string{"doc.go"}, testFiles: 2},
		{path: "web", dir: onlyDoc, goFiles: []string{"doc.go"}},
	}
	got, err := placeBreaches(graph)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"folder faults holds only tests: move each test to the package whose behaviour it checks",
		"folder faults/more holds only tests: move each test to the package whose behaviour it checks",
		"tests of package gateway import restapi: tests that need the whole server belong in cmd/han-gateway",
	}
	if !slices.Equal(got, want) {
		t.Errorf("placeBreaches reported\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}
