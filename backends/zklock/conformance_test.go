package zklock

import (
	"sync"
	"testing"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

func TestConformance(t *testing.T) { conformance(t) }

// TestConformanceWithCredentials runs the suite under a root only a
// digest user may use, every Locker with that user's credentials and
// making its nodes that user's: every request of every path (watches,
// revocations, semaphores, read/write locks, releases) goes with them.
func TestConformanceWithCredentials(t *testing.T) {
	secure, _ := secureRoot(t, servers(t))
	conformance(t, WithRoot(secure+"/locks"), digestAuth(authPassword), WithACL(zk.AuthACL(zk.PermAll)...))
}

// conformance runs drivertest's suite on Lockers with opts.
func conformance(t *testing.T, opts ...Option) {
	srv := servers(t)
	probe := dial(t, srv, opts...)
	var (
		mu      sync.Mutex
		proxies = map[driver.Locker]*drivertest.Proxy{}
	)
	drivertest.Run(t, drivertest.Backend{
		// Every client goes through its own proxy, so that Abandon can cut
		// it off as a crash would: the session then expires on the server,
		// which a Close (it ends the session at once) would not show.
		NewLocker: func(t testing.TB) driver.Locker {
			p := drivertest.StartProxy(t, srv[0])
			l := dial(t, []string{p.Addr()}, opts...)
			mu.Lock()
			proxies[l] = p
			mu.Unlock()
			return l
		},
		TTL: testSession,
		Abandon: func(t testing.TB, l driver.Locker) {
			mu.Lock()
			defer mu.Unlock()
			proxies[l].Cut()
		},
		FIFO:    true,
		Waiters: func(t testing.TB, key string) int { return waiters(t, probe, key) },
		Silence: func(t testing.TB) (driver.Locker, func()) {
			p := drivertest.StartProxy(t, srv[0])
			l := dial(t, []string{p.Addr()}, opts...)
			// The silence ends first at cleanup, so that the Locker's
			// Close ends its session at once.
			t.Cleanup(p.Reset)
			return l, p.Blackhole
		},
	})
}
