package browser

import (
	"context"
	"os"
	"os/exec"
	"testing"

	"github.com/chromedp/chromedp"
)

// Flags are the launch flags that work on the CI machines (no GPU, no
// sandbox as root, nothing phoning home); Start adds a fresh user-data-dir.
var Flags = []string{
	"headless", "no-sandbox", "disable-gpu", "disable-quic", "no-first-run",
	"disable-background-networking", "disable-component-update", "disable-sync",
	"disable-dev-shm-usage", "no-default-browser-check", "disable-default-apps", "disable-extensions",
	"disable-background-timer-throttling", "disable-renderer-backgrounding", "disable-backgrounding-occluded-windows",
}

// Path is Debian's chromium in PATH, or "" when there is none.
func Path() string {
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// Start launches one Chromium for the test with a 1280×860 window and
// returns its root chromedp context; the browser ends with the test.
func Start(t *testing.T) context.Context {
	t.Helper()
	path := Path()
	if path == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("chromium not found in PATH: the browser tests need Debian's chromium package " +
				"(apt-get install -y chromium; .ci/run and scripts/lib.sh han_ensure_packages --chromium install it)")
		}
		t.Skip("chromium not found in PATH (apt-get install -y chromium); the browser tests are required in CI")
	}
	opts := []chromedp.ExecAllocatorOption{chromedp.ExecPath(path), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 860)}
	for _, f := range Flags {
		opts = append(opts, chromedp.Flag(f, true))
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		cancel()
		cancelAlloc()
		t.Fatalf("start chromium (%s): %v", path, err)
	}
	t.Cleanup(func() {
		_ = chromedp.Cancel(ctx)
		cancel()
		cancelAlloc()
	})
	return ctx
}
