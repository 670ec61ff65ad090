package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// cpuIdleRoot is where Linux lists each CPU's idle states.
const cpuIdleRoot = "/sys/devices/system/cpu"

// idleEntries is how many times the CPUs under root (cpuIdleRoot) have
// entered an idle state that stops them (a halt, not the POLL state, in
// which a CPU only spins) since boot, summed over the CPUs; false where
// Linux shows no cpuidle state there.
//
// The report shows these entries per uncontended cycle, because they
// decide much of a cycle's time: a cycle is two round trips on loopback,
// and a CPU that halts while the client waits for the server must be woken
// for the answer, which on a virtual machine goes through the host and
// costs tens of µs a wake-up. Whether the CPUs halt depends on the rest of
// the machine (other load keeps them running) and on the client (one that
// hands each call to another goroutine keeps a second runtime thread
// running for a while): on an idle machine such a client beats one that
// calls on its own goroutine, and on a busy one it is the slower of the
// two. The count tells a reader which machine the figures come from.
func idleEntries(root string) (int64, bool) {
	states, _ := filepath.Glob(filepath.Join(root, "cpu[0-9]*", "cpuidle", "state[0-9]*"))
	var sum int64
	found := false
	for _, s := range states {
		name, err := os.ReadFile(filepath.Join(s, "name"))
		if err != nil || strings.TrimSpace(string(name)) == "POLL" {
			continue
		}
		usage, err := os.ReadFile(filepath.Join(s, "usage"))
		if err != nil {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(usage)), 10, 64)
		if err != nil {
			continue
		}
		sum += n
		found = true
	}
	return sum, found
}
