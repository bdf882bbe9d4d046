// Package browser starts headless Chromium for the browser tests: Debian's
// chromium package found in PATH (a test never downloads a browser),
// driven over the DevTools protocol by chromedp. Without one in PATH a test
// is skipped, or fails when CI=true, where the browser tests are required.
// Test code only.
package browser
