package drivertest

import (
	"os/exec"
	"runtime"
	"testing"
)

// Load keeps every CPU of the machine busy with other processes until t
// ends, the way a noisy neighbour would, so that a test can show that held
// locks survive a loaded machine (renewals delayed by the scheduler, not by
// the backend).
func Load(t testing.TB) {
	t.Helper()
	for range runtime.NumCPU() {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			t.Fatalf("drivertest: starting a load process: %v", err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
}
