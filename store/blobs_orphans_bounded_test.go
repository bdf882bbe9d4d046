package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store"
)

// One run examines at most OrphanScan files and the next resumes after
// them, so a folder of any size costs each run the same bounded work, and
// every orphan goes within a round of runs.
func TestOrphanBlobSweepIsBoundedAndResumes(t *testing.T) {
	f := newOrphanFixture(t)
	var orphans []string
	for range 7 {
		orphans = append(orphans, f.blob(ids.New(), 2*time.Hour))
	}
	_, named := f.uploaded(2 * time.Hour)
	j := store.NewJanitor(f.st, store.JanitorConfig{Blobs: f.blobs, Batch: 2, OrphanScan: 3}, nil)
	total := 0
	for run := 0; run < 4; run++ {
		n, err := j.SweepOrphanBlobs(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if n > 3 {
			t.Fatalf("run %d deleted %d blobs, more than the 3 files it may examine", run, n)
		}
		total += n
	}
	if total != len(orphans) {
		t.Fatalf("4 runs of 3 files over 8 deleted %d orphans, want %d", total, len(orphans))
	}
	for _, k := range orphans {
		if f.exists(k) {
			t.Errorf("orphan %s survived a full round", k)
		}
	}
	if !f.exists(named) {
		t.Fatal("the sweep deleted a blob its row names")
	}
	// Another instance sweeping the same folder at once, or a run after
	// the files are gone, is harmless.
	if _, err := store.NewJanitor(f.st, store.JanitorConfig{Blobs: f.blobs}, nil).SweepOrphanBlobs(context.Background()); err != nil {
		t.Fatal(err)
	}
}
