package drivertest

import (
	"os/exec"
	"runtime"
	"sync"
	"testing"
)

// Load keeps one CPU of the machine busy with another process, the way a
// noisy neighbour would, so that a test can show that held locks survive a
// loaded machine (renewals delayed by the scheduler, not by the backend).
// The process runs until the returned stop is called or t ends.
func Load(t testing.TB) (stop func()) {
	t.Helper()
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatalf("drivertest: starting a load process: %v", err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	t.Cleanup(stop)
	return stop
}

// HeapAlloc is the live heap after a collection: benchmarks read it before
// and after taking many locks to report the bytes each held lock costs.
func HeapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
