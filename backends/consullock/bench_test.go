package consullock

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/guard/driver"
)

// kindCounter counts a client's requests about keys by kind: transactions
// (each a Raft write), blocking queries, and consistent reads. The
// session's own requests (creation, renewal, its marker watch) are left
// out.
type kindCounter struct {
	base                 http.RoundTripper
	txns, queries, reads atomic.Int64
	refused              atomic.Int64 // transactions rolled back
}

func (kc *kindCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	switch p := r.URL.Path; {
	case strings.HasPrefix(p, "/v1/session/"), strings.HasPrefix(p, "/v1/kv/"+RevokedPrefix):
	case p == "/v1/txn":
		kc.txns.Add(1)
		resp, err := kc.base.RoundTrip(r)
		if err == nil && resp.StatusCode == http.StatusConflict {
			kc.refused.Add(1)
		}
		return resp, err
	case r.URL.Query().Has("index"):
		kc.queries.Add(1)
	default:
		kc.reads.Add(1)
	}
	return kc.base.RoundTrip(r)
}

// raftIndex is the agent's last Raft log index: its growth over a run is
// the run's Raft applies (the test agent is a single server).
func raftIndex(b *testing.B, c *api.Client) int64 {
	b.Helper()
	self, err := c.Agent().Self()
	if err != nil {
		b.Fatal(err)
	}
	raft, _ := self["Stats"]["raft"].(map[string]any)
	s, _ := raft["last_log_index"].(string)
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		b.Fatalf("raft last_log_index %q: %v", s, err)
	}
	return n
}

// BenchmarkContended has 8 Lockers, each with its client and session,
// take turns on one key, waiting and not fair, each releasing as soon as
// it holds and asking again at once (bench-peers' contended scenario at
// hold 0). Per acquisition it reports the Raft applies (the agent's log
// growth, which includes anything else written meanwhile), the requests by
// kind, and the handovers (the lock passing to another Locker), whose
// number depends on how many acquisitions fit in yieldFor; and the applies
// beyond the 2 of every acquisition (the grant and the release) per
// handover, which does not.
func BenchmarkContended(b *testing.B) {
	const contenders = 8
	a := addr(b)
	counters := make([]*kindCounter, contenders)
	lockers := make([]*Locker, contenders)
	for i := range lockers {
		cfg := api.DefaultConfig()
		cfg.Address = a
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 103, 0, byte(i+1))}}
		cfg.Transport.DialContext = d.DialContext
		counters[i] = &kindCounter{base: cfg.Transport}
		cfg.HttpClient = &http.Client{Transport: counters[i]}
		c, err := api.NewClient(cfg)
		if err != nil {
			b.Fatal(err)
		}
		lockers[i] = lockerOn(b, c)
	}
	admin := newClient(b, a)
	key := name("bench")
	ctx := context.Background()
	opts := driver.AcquireOptions{TTL: MinTTL, Wait: true}
	// Each Locker's session is made before the count.
	for _, l := range lockers {
		le, err := l.Acquire(ctx, key, opts)
		if err != nil {
			b.Fatal(err)
		}
		if err := le.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	sum := func() (txns, refused, queries, reads int64) {
		for _, kc := range counters {
			txns += kc.txns.Load()
			refused += kc.refused.Load()
			queries += kc.queries.Load()
			reads += kc.reads.Load()
		}
		return
	}
	t0, f0, q0, r0 := sum()
	i0 := raftIndex(b, admin)
	b.ResetTimer()
	var (
		left    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		failed  error
	)
	left.Store(int64(b.N))
	// The lock passes from one Locker to another at a handover; the
	// holder changes it, under the lock.
	var holder, handovers atomic.Int64
	holder.Store(-1)
	for i, l := range lockers {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				le, err := l.Acquire(ctx, key, opts)
				if err == nil {
					if holder.Swap(int64(i)) != int64(i) {
						handovers.Add(1)
					}
					err = le.Release(ctx)
				}
				if err != nil {
					errOnce.Do(func() { failed = err })
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if failed != nil {
		b.Fatal(failed)
	}
	i1 := raftIndex(b, admin)
	t1, f1, q1, r1 := sum()
	n := float64(b.N)
	b.ReportMetric(float64(i1-i0)/n, "applies/acq")
	b.ReportMetric(float64(handovers.Load())/n, "handovers/acq")
	b.ReportMetric(float64(i1-i0-2*int64(b.N))/float64(max(handovers.Load(), 1)), "extra-applies/handover")
	b.ReportMetric(float64(t1-t0)/n, "txns/acq")
	b.ReportMetric(float64(f1-f0)/n, "refused/acq")
	b.ReportMetric(float64(q1-q0)/n, "queries/acq")
	b.ReportMetric(float64(r1-r0)/n, "reads/acq")
	b.ReportMetric(float64(t1-t0+q1-q0+r1-r0)/n, "requests/acq")
}
