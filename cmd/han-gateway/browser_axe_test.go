package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Accessibility checks: axe-core (pinned exactly in testdata/axe's
// package.json and package-lock.json, installed with `npm ci` when its
// node_modules is missing) is injected into the page over the DevTools
// protocol and run against the WCAG 2.0/2.1 A and AA rules.

// axeDir holds the pinned axe-core package.
const axeDir = "testdata/axe"

// axeTags are the rule sets every checked page state must pass.
var axeTags = []string{"wcag2a", "wcag2aa", "wcag21a", "wcag21aa"}

var axeSource struct {
	once sync.Once
	js   string
	err  error
}

// axeScript is axe.min.js, installed with `npm ci` on first use when
// missing. Without npm the test fails under CI=true and is skipped otherwise.
func axeScript(t *testing.T) string {
	t.Helper()
	axeSource.once.Do(func() {
		path := filepath.Join(axeDir, "node_modules", "axe-core", "axe.min.js")
		if _, err := os.Stat(path); err != nil {
			npm, lerr := exec.LookPath("npm")
			if lerr != nil {
				axeSource.err = fmt.Errorf("npm not found: the accessibility checks install axe-core with `npm ci` in cmd/han-gateway/%s", axeDir)
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund")
			cmd.Dir = axeDir
			if out, err := cmd.CombinedOutput(); err != nil {
				axeSource.err = fmt.Errorf("npm ci in cmd/han-gateway/%s: %v\n%s", axeDir, err, out)
				return
			}
		}
		b, err := os.ReadFile(path)
		axeSource.js, axeSource.err = string(b), err
	})
	if axeSource.err != nil {
		if os.Getenv("CI") == "true" || !strings.HasPrefix(axeSource.err.Error(), "npm not found") {
			t.Fatal(axeSource.err)
		}
		t.Skip(axeSource.err)
	}
	return axeSource.js
}

type axeViolation struct {
	ID     string `json:"id"`
	Impact string `json:"impact"`
	Help   string `json:"help"`
	Nodes  []struct {
		Target  string `json:"target"`
		Summary string `json:"summary"`
	} `json:"nodes"`
}

// axe runs axe-core on the page as it is now and fails the test with every
// violation found; state names the page state in the log.
func (p *page) axe(state string) {
	p.t.Helper()
	src := axeScript(p.t)
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("window.axe ? true : (() => { "+src+"\n; return true; })()")); err != nil {
		p.t.Fatalf("%s: inject axe-core: %v", p.name, err)
	}
	tags, _ := json.Marshal(axeTags)
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(async () => {
		const r = await axe.run(document, { runOnly: { type: "tag", values: `+string(tags)+` }, resultTypes: ["violations"] });
		return JSON.stringify({ passes: r.passes.length, violations: r.violations.map((v) => ({ id: v.id, impact: v.impact, help: v.help,
			nodes: v.nodes.map((n) => ({ target: n.target.join(" "), summary: n.failureSummary })) })) });
	})()`, chromedp.EvalAwaitPromise))
	if err != nil {
		p.t.Fatalf("%s: axe.run (%s): %v", p.name, state, err)
	}
	var res struct {
		Passes     int            `json:"passes"`
		Violations []axeViolation `json:"violations"`
	}
	if err := json.Unmarshal([]byte(raw), &res); err != nil {
		p.t.Fatalf("%s: axe result: %v", p.name, err)
	}
	if len(res.Violations) == 0 {
		p.t.Logf("axe %s: 0 violations (%d rules passed)", state, res.Passes)
		return
	}
	var b strings.Builder
	for _, v := range res.Violations {
		fmt.Fprintf(&b, "\n  %s (%s): %s", v.ID, v.Impact, v.Help)
		for _, n := range v.Nodes {
			fmt.Fprintf(&b, "\n    %s: %s", n.Target, strings.ReplaceAll(n.Summary, "\n", " "))
		}
	}
	p.shot("axe-" + state)
	p.t.Errorf("%s: axe found %d violation(s) in state %q:%s", p.name, len(res.Violations), state, b.String())
}
