package main

import (
	"os"
	"path/filepath"
	"testing"
)

// idleEntries sums the halting idle states of every CPU and leaves out
// POLL, in which a CPU spins and wakes at no cost.
func TestIdleEntries(t *testing.T) {
	root := t.TempDir()
	state := func(cpu, st, name, usage string) {
		dir := filepath.Join(root, cpu, "cpuidle", st)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for f, v := range map[string]string{"name": name + "\n", "usage": usage + "\n"} {
			if err := os.WriteFile(filepath.Join(dir, f), []byte(v), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n, ok := idleEntries(root); ok || n != 0 {
		t.Errorf("no cpuidle states: got %d, %v; want 0, false", n, ok)
	}
	state("cpu0", "state0", "POLL", "500")
	state("cpu0", "state1", "haltpoll", "7")
	state("cpu1", "state0", "POLL", "300")
	state("cpu1", "state1", "C1", "11")
	state("cpu1", "state2", "C6", "2")
	if n, ok := idleEntries(root); !ok || n != 20 {
		t.Errorf("got %d, %v; want 7+11+2 = 20, true", n, ok)
	}
}
