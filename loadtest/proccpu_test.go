package loadtest

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"testing"
	"time"
)

func TestProcCPUFlag(t *testing.T) {
	var p ProcCPU
	if err := p.Set("gateway=12,postgres=34+"); err != nil {
		t.Fatal(err)
	}
	if err := p.Set("redis=56"); err != nil {
		t.Fatal(err)
	}
	if got, want := p.String(), "gateway=12,postgres=34+,redis=56"; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
	for _, bad := range []string{"gateway", "=12", "gateway=x", "gateway=0", "generator=12", "gateway=-3+"} {
		if err := (&ProcCPU{}).Set(bad); err == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
}

// A process counted with its children includes the CPU of a child that ran
// and was reaped between two samples; without "+" it does not.
func TestProcCPUCountsReapedChildren(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	self := strconv.Itoa(os.Getpid())
	var tree, alone ProcCPU
	if err := tree.Set("self=" + self + "+"); err != nil {
		t.Fatal(err)
	}
	if err := alone.Set("self=" + self); err != nil {
		t.Fatal(err)
	}
	t0, a0 := tree.Sample(), alone.Sample()
	cmd := exec.Command("sh", "-c", "i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	child := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	if child < 50*time.Millisecond {
		t.Fatalf("the child used only %v of CPU; the loop is too short to measure", child)
	}
	t1, a1 := tree.Sample(), alone.Sample()
	tick := time.Second / clockTicks
	if d := t1["self"] - t0["self"]; d < child-2*tick {
		t.Errorf("with children: %v counted, the reaped child alone used %v", d, child)
	}
	if d := a1["self"] - a0["self"]; d >= child-2*tick {
		t.Errorf("without children: %v counted, as much as the child's %v", d, child)
	}
	if _, ok := t1["generator"]; !ok {
		t.Error("the generator's own CPU is missing from the sample")
	}
	per := t1.PerOp(t0, 1000)
	if per["self"] <= 0 {
		t.Errorf("PerOp = %v, want a positive self figure", per)
	}
}
