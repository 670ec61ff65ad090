//go:build unix

package drivertest

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// Exclusive makes t the only test on the machine holding name until t
// ends, whatever process or package runs it: go test runs packages side by
// side, and two tests that each load the whole machine would measure each
// other rather than the backend.
func Exclusive(t testing.TB, name string) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "warden-drivertest-"+name+".lock"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatalf("drivertest: %v", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatalf("drivertest: flock: %v", err)
	}
	// Closing the file releases the lock, as the process's exit would.
	t.Cleanup(func() { f.Close() })
}
