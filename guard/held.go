package guard

import (
	"cmp"
	"slices"
	"time"
)

// HeldLock is one lock this process holds through a Guard, as Held reports
// it.
type HeldLock struct {
	// Key is the key as it was passed to Lock, without the Guard's prefix.
	Key string `json:"key"`
	// Mode is "exclusive", "read", "write" or "semaphore".
	Mode string `json:"mode"`
	// Token is the lease's fencing token.
	Token uint64 `json:"token"`
	// Acquired is when the lease was granted (the send time of the request
	// that took it, by this process's clock).
	Acquired time.Time `json:"acquired"`
	// Renewed is the send time of the latest renewal the backend confirmed,
	// or Acquired when there was none. Zero for a lease kept by a backend
	// session, which is renewed as a whole, and then left out of JSON.
	Renewed time.Time `json:"renewed,omitzero"`
	// Expiry is the lease's conservative expiry (Lock.Expiry): the lock is
	// declared lost a safety margin before it unless a renewal moves it.
	Expiry time.Time `json:"expiry"`
	// SessionBound: the lease lives as long as the backend session that
	// keeps it (etcd, ZooKeeper, Consul), and Expiry is the session's.
	SessionBound bool `json:"session_bound"`
}

// Held lists the locks this Guard holds now, by key: what an operator or a
// debug page asks first during an incident. It costs one pass over the
// held locks under the lease keeper's mutex.
func (g *Guard) Held() []HeldLock {
	k := &g.keeper
	k.mu.Lock()
	out := make([]HeldLock, 0, len(k.locks))
	heldLock := func(l *Lock) {
		out = append(out, HeldLock{Key: l.key, Mode: l.mode.String(), Token: l.lease.Token(),
			Acquired: k.time(l.granted), Renewed: k.time(l.expiry - int64(l.ttl)), Expiry: k.time(l.expiry)})
	}
	for _, l := range k.locks {
		heldLock(l)
	}
	k.youngLocked(heldLock)
	for _, sw := range k.sessions {
		exp := sw.sess.Expiry()
		for _, l := range sw.locks {
			out = append(out, HeldLock{Key: l.key, Mode: l.mode.String(), Token: l.lease.Token(),
				Acquired: k.time(l.granted), Expiry: exp, SessionBound: true})
		}
	}
	k.mu.Unlock()
	slices.SortFunc(out, func(a, b HeldLock) int {
		return cmp.Or(cmp.Compare(a.Key, b.Key), cmp.Compare(a.Token, b.Token))
	})
	return out
}
