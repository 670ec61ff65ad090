package redislock

import "testing"

// TestLockWaitersOf: the two names a plain lock's attempts send are the
// ones mutexNamesOf gives the rest of the lock's scripts, for a name that
// needs escaping too.
func TestLockWaitersOf(t *testing.T) {
	for _, key := range []string{"orders/close", "a{b}c%", ""} {
		n := mutexNamesOf(key)
		lock, waiters := lockWaitersOf(key)
		if lock != n.lock || waiters != n.waiters {
			t.Errorf("lockWaitersOf(%q) = %q, %q; mutexNamesOf has %q, %q", key, lock, waiters, n.lock, n.waiters)
		}
	}
}
