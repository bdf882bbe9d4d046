package loadtest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ProcCPU names processes whose CPU time a run reports per measured step,
// so that a figure counts only the seconds of that step (no setup, no
// read-back). Each entry is name=PID; a trailing "+" (postgres=812+) also
// counts the process's children: the live ones (their own time) and the
// reaped ones (the parent's cutime and cstime) — PostgreSQL's backends,
// WAL writer and checkpointer are children of the postmaster. The
// generator itself is always counted as "generator".
type ProcCPU struct {
	procs []procSpec
}

type procSpec struct {
	name string
	pid  int
	tree bool
}

// clockTicks is the kernel's USER_HZ, the unit of CPU times in /proc.
const clockTicks = 100

// String implements flag.Value.
func (p *ProcCPU) String() string {
	var parts []string
	for _, s := range p.procs {
		v := s.name + "=" + strconv.Itoa(s.pid)
		if s.tree {
			v += "+"
		}
		parts = append(parts, v)
	}
	return strings.Join(parts, ",")
}

// Set implements flag.Value: name=PID or name=PID+, repeatable or
// comma-separated.
func (p *ProcCPU) Set(v string) error {
	for _, item := range strings.Split(v, ",") {
		name, pidS, ok := strings.Cut(strings.TrimSpace(item), "=")
		tree := strings.HasSuffix(pidS, "+")
		pid, err := strconv.Atoi(strings.TrimSuffix(pidS, "+"))
		if !ok || name == "" || name == "generator" || err != nil || pid < 1 {
			return fmt.Errorf("%q: want name=PID or name=PID+ (with children); \"generator\" is always counted", item)
		}
		p.procs = append(p.procs, procSpec{name, pid, tree})
	}
	return nil
}

// Check reports a named process /proc cannot show now: a -cpu-pid that
// names no running process (a typo, a server already stopped) would
// otherwise leave its figure out of every measurement without a word.
func (p *ProcCPU) Check() error {
	for _, s := range p.procs {
		if len(procStatFields(s.pid)) < 15 {
			return fmt.Errorf("-cpu-pid %s=%d: no such process", s.name, s.pid)
		}
	}
	return nil
}

// CPUSample is the CPU time each named process had used at one instant.
type CPUSample map[string]time.Duration

// Sample reads every named process's CPU time (user + system) now. A
// process /proc cannot show is left out.
func (p *ProcCPU) Sample() CPUSample {
	out := CPUSample{}
	if t, ok := procTicks(os.Getpid(), false); ok {
		out["generator"] = t
	}
	for _, s := range p.procs {
		if t, ok := procTicks(s.pid, s.tree); ok {
			out[s.name] = t
		}
	}
	return out
}

// PerOp is each process's CPU between from and to divided by ops, in
// milliseconds per operation, keyed by process name.
func (to CPUSample) PerOp(from CPUSample, ops int64) map[string]float64 {
	out := map[string]float64{}
	if ops <= 0 {
		return out
	}
	for name, t1 := range to {
		if t0, ok := from[name]; ok {
			out[name] = float64(t1-t0) / float64(time.Millisecond) / float64(ops)
		}
	}
	return out
}

// procTicks is pid's CPU time; with tree, plus its reaped children's and its
// live children's own.
func procTicks(pid int, tree bool) (time.Duration, bool) {
	f := procStatFields(pid)
	if len(f) < 15 {
		return 0, false
	}
	last := 12 // utime, stime (fields 14 and 15 of stat, 11 and 12 from state)
	if tree {
		last = 14 // + cutime, cstime
	}
	ticks := sumFields(f, 11, last)
	if tree {
		for _, c := range procChildren(pid) {
			if cf := procStatFields(c); len(cf) >= 13 {
				ticks += sumFields(cf, 11, 12)
			}
		}
	}
	return time.Duration(ticks) * time.Second / clockTicks, true
}

// procStatFields is /proc/<pid>/stat from field 3 (state) on, index 0;
// nil when unreadable.
func procStatFields(pid int) []string {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	s := string(raw)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
}

func sumFields(f []string, from, to int) int64 {
	var n int64
	for i := from; i <= to; i++ {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		n += v
	}
	return n
}

// procChildren lists pid's live children (every thread's children file).
func procChildren(pid int) []int {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []int
	for _, t := range tasks {
		raw, err := os.ReadFile(dir + "/" + t.Name() + "/children")
		if err != nil {
			continue
		}
		for _, s := range strings.Fields(string(raw)) {
			if c, err := strconv.Atoi(s); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}
