package etcdlock

import (
	"context"
	"net/url"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/warden-go/warden/guard/driver"
)

// TestNoStatePerKey: every key a lock puts lives on its session's etcd
// lease, and a release deletes it, so a key locked once and released leaves
// nothing behind, however many keys come and go.
func TestNoStatePerKey(t *testing.T) {
	eps := endpoints(t)
	l, c := newLocker(t, eps)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k := name("state")
	o := opts(MinTTL, false)
	take := []func() (driver.Lease, error){
		func() (driver.Lease, error) { return l.Acquire(ctx, k, o) },
		func() (driver.Lease, error) { return l.AcquireRead(ctx, k, o) },
		func() (driver.Lease, error) { return l.AcquireWrite(ctx, k, o) },
		func() (driver.Lease, error) { return l.AcquireSemaphore(ctx, k, 2, o) },
	}
	all := func() *clientv3.GetResponse {
		t.Helper()
		// Everything under the key's name, whatever suffix a kind adds.
		resp, err := c.Get(ctx, url.PathEscape(k), clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for i, acquire := range take {
		lease, err := acquire()
		if err != nil {
			t.Fatalf("acquisition %d: %v", i, err)
		}
		for _, kv := range all().Kvs {
			if kv.Lease == 0 {
				t.Errorf("acquisition %d put %q without a lease: it would outlive the session", i, kv.Key)
			}
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
		if left := all().Kvs; len(left) != 0 {
			t.Errorf("after release %d, %d keys are left under %q: %q", i, len(left), url.PathEscape(k), left[0].Key)
		}
	}
}
