package redislock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
)

// TestReadOnlyReadsAfterFailover: a ReadOnly Cluster client whose slot map
// was loaded before a failover still names the old master, now a replica,
// as the slot's master. go-redis sends READONLY on every connection of
// such a client, on which the replica would answer Inspect's and Highest's
// reads from its own data; its link to the new master is cut before the
// lock is taken and the token written, as a lagging replica's is. Each
// read answers as the new master does; so does List, whose SCAN of the
// masters has the map reloaded first.
func TestReadOnlyReadsAfterFailover(t *testing.T) {
	c := startReshardCluster(t, 1)
	m := c.shards[0]
	r := c.replicate(m)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Every client gives the password the new master will ask below (m's
	// default user has none, and takes any).
	withPassword := func(o *goredis.ClusterOptions) { o.Password = "pw" }
	// A client for each read, as each may have the map reloaded.
	reader := func() *goredis.ClusterClient {
		return c.client(withPassword, func(o *goredis.ClusterOptions) { o.ReadOnly = true })
	}
	ro := newLocker(t, reader())
	lister := newLocker(t, reader())
	fence, err := NewFence(reader())
	if err != nil {
		t.Fatal(err)
	}
	const key = "ro/failover"
	// The readers' slot maps are loaded now: m is the master.
	if in, err := ro.Inspect(ctx, key); err != nil || len(in.Holders) != 0 {
		t.Fatalf("Inspect before the failover = %+v, %v", in, err)
	}
	if page, err := lister.List(ctx, "ro/", "", 10); err != nil || len(page) != 0 {
		t.Fatalf("List before the failover = %+v, %v", page, err)
	}
	if tok, err := fence.Highest(ctx, key); err != nil || tok != 0 {
		t.Fatalf("Highest before the failover = %d, %v", tok, err)
	}
	c.must(r, "CLUSTER", "FAILOVER")
	eventually(t, "the failover", func() bool {
		im, _ := c.do(m, "INFO", "replication").Text()
		ir, _ := c.do(r, "INFO", "replication").Text()
		return strings.Contains(ir, "role:master") && strings.Contains(im, "role:slave") &&
			strings.Contains(im, "master_link_status:up")
	})
	// The new master asks its replica a password it lacks (no masterauth):
	// once cut, the replica's link stays down.
	c.must(r, "ACL", "SETUSER", "default", "resetpass", ">pw")
	r.admin.Options().Password = "pw"
	c.must(m, "CLIENT", "KILL", "TYPE", "master")
	holder := newLocker(t, c.client(withPassword)) // its slot map, loaded now, names r
	if _, err := holder.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	c.must(r, "HSET", fence.Key(key), "t", 7)
	if info, _ := c.do(m, "INFO", "replication").Text(); !strings.Contains(info, "master_link_status:down") {
		t.Fatalf("the old master follows the new one again: %s", info)
	}

	if in, err := ro.Inspect(ctx, key); err != nil || len(in.Holders) != 1 {
		t.Errorf("Inspect after the failover = %+v, %v; want one holder", in, err)
	}
	if page, err := lister.List(ctx, "ro/", "", 10); err != nil || len(page) != 1 || len(page[0].Holders) != 1 {
		t.Errorf("List after the failover = %+v, %v; want the held lock", page, err)
	}
	if tok, err := fence.Highest(ctx, key); err != nil || tok != 7 {
		t.Errorf("Highest after the failover = %d, %v; want 7", tok, err)
	}
}

// TestReadOnlyReadsDuringMigration: while a slot moves and its keys have
// gone already, their old master answers ASK. A ReadOnly client's Highest
// and Store.Get follow it, as go-redis does for the commands it routes,
// rather than wait the migration out, which goes on here only once they
// have answered. List's read of a lock's state follows it too, and the
// lock's inspection (its keys but one are absent: TRYAGAIN on the node
// they move to) waits the migration out.
func TestReadOnlyReadsDuringMigration(t *testing.T) {
	c := startReshardCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const resource = "{ro}ask" // the fence's key and the record's in one slot
	reader := c.client(func(o *goredis.ClusterOptions) { o.ReadOnly = true })
	fence, err := NewFence(reader)
	if err != nil {
		t.Fatal(err)
	}
	store := newStore(t, reader)
	slot := c.slot(fence.Key(resource))
	if s := c.slot(store.recordKey("s", resource)); s != slot {
		t.Fatalf("the record's slot %d, the fence's %d", s, slot)
	}
	if _, err := newStore(t, c.client()).Claim(ctx, idempotency.Claim{Scope: "s", Key: resource, Fingerprint: "f", Owner: "o", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	// The lock "ro" has its keys in that slot too.
	lister := newLocker(t, reader)
	if _, err := newLocker(t, c.client()).Acquire(ctx, "ro", driver.AcquireOptions{TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if s := c.slot(lockKeyOf("ro")); s != slot {
		t.Fatalf("the lock's slot %d, the fence's %d", s, slot)
	}
	listed := make(chan string, 1)
	src := c.owner(slot)
	c.must(src, "HSET", fence.Key(resource), "t", 5)
	if h, err := fence.Highest(ctx, resource); err != nil || h != 5 {
		t.Fatalf("Highest before the move = %d, %v", h, err)
	}
	moved := false
	c.moveSlot(slot, src, c.other(src), 1, func() {
		if n, _ := c.do(src, "CLUSTER", "COUNTKEYSINSLOT", slot).Int(); n != 0 || moved {
			return
		}
		moved = true
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		defer rcancel()
		if h, err := fence.Highest(rctx, resource); err != nil || h != 5 {
			t.Errorf("Highest while the slot moves = %d, %v; want 5", h, err)
		}
		if rec, err := store.Get(rctx, "s", resource); err != nil || rec.Owner != "o" {
			t.Errorf("Store.Get while the slot moves = %+v, %v; want the claim", rec, err)
		}
		redirected := commandStat(t, src, "get", "rejected_calls")
		go func() {
			page, err := lister.List(ctx, "ro", "", 10)
			listed <- fmt.Sprintf("%d locks, %v", len(page), err)
		}()
		eventually(t, "List's GET redirected", func() bool { return commandStat(t, src, "get", "rejected_calls") > redirected })
	})
	if !moved {
		t.Fatal("never saw the slot open with its keys moved")
	}
	if got := <-listed; got != "1 locks, <nil>" {
		t.Errorf("List begun while the slot moved = %s; want the held lock", got)
	}
}

// commandStat is the figure field ("calls", "rejected_calls") that s's
// INFO commandstats gives cmd ("get", "cluster|slots"), 0 if none.
func commandStat(t *testing.T, s *shard, cmd, field string) int64 {
	t.Helper()
	info, err := s.admin.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		stats, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		for f := range strings.SplitSeq(stats, ",") {
			if v, ok := strings.CutPrefix(f, field+"="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
	}
	return 0
}

// TestReadOnlyClusterSlotsClient: a Cluster client whose slot map comes
// from ClusterOptions.ClusterSlots, as a FailoverClusterClient's does, may
// name servers that are no Cluster's members, which know neither READONLY
// nor READWRITE; go-redis sends them no READONLY, and the reads on the
// master send neither.
func TestReadOnlyClusterSlotsClient(t *testing.T) {
	srv := drivertest.StartRedis(t)
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{
		ReadOnly: true,
		ClusterSlots: func(context.Context) ([]goredis.ClusterSlot, error) {
			return []goredis.ClusterSlot{{Start: 0, End: 16383, Nodes: []goredis.ClusterNode{{Addr: srv.Addr()}}}}, nil
		},
	})
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l := newLocker(t, cc)
	fence, err := NewFence(cc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "slots/a", driver.AcquireOptions{TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if in, err := l.Inspect(ctx, "slots/a"); err != nil || len(in.Holders) != 1 {
		t.Errorf("Inspect = %+v, %v; want one holder", in, err)
	}
	if page, err := l.List(ctx, "slots/", "", 10); err != nil || len(page) != 1 {
		t.Errorf("List = %+v, %v; want the held lock", page, err)
	}
	if tok, err := fence.Highest(ctx, "slots/a"); err != nil || tok != 0 {
		t.Errorf("Highest = %d, %v; want 0", tok, err)
	}
}

// TestReadOnlyConnectionsStayReadOnly: the reads on the master switch their
// connection to READWRITE for the read alone; go-redis's READONLY
// connections go back to its pools as they came, each flagged readonly (r)
// in CLIENT LIST.
func TestReadOnlyConnectionsStayReadOnly(t *testing.T) {
	c := startReshardCluster(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reader := c.client(func(o *goredis.ClusterOptions) { o.ReadOnly, o.ClientName = true, "reader" })
	l := newLocker(t, reader)
	fence, err := NewFence(reader)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "conn/a", driver.AcquireOptions{TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if in, err := l.Inspect(ctx, "conn/a"); err != nil || len(in.Holders) != 1 {
			t.Fatalf("Inspect = %+v, %v", in, err)
		}
		if page, err := l.List(ctx, "conn/", "", 10); err != nil || len(page) != 1 {
			t.Fatalf("List = %+v, %v", page, err)
		}
		if _, err := fence.Highest(ctx, "conn/a"); err != nil {
			t.Fatal(err)
		}
	}
	list, err := c.do(c.shards[0], "CLIENT", "LIST").Text()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for line := range strings.SplitSeq(strings.TrimSpace(list), "\n") {
		if !strings.Contains(" "+line+" ", " name=reader ") {
			continue
		}
		n++
		for f := range strings.FieldsSeq(line) {
			if flags, ok := strings.CutPrefix(f, "flags="); ok && !strings.Contains(flags, "r") {
				t.Errorf("a connection of the reader is not READONLY: %s", line)
			}
		}
	}
	if n == 0 {
		t.Fatalf("no connection of the reader in CLIENT LIST:\n%s", list)
	}
}

// TestReadWriteRefusalKeepsReadOnlyScripts: a ReadOnly Cluster client's
// user refused READWRITE, which its reads on the master need, has them
// refused; once granted it, its Locker reads again. READWRITE's refusal,
// which the read carries, is no refusal of EVALSHA_RO: taken for one, it
// made the Locker run its read-only scripts by EVALSHA for good, which a
// user allowed only to read is refused, also after the ACL was mended.
func TestReadWriteRefusalKeepsReadOnlyScripts(t *testing.T) {
	c := startReshardCluster(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m := c.shards[0]
	key := "readwrite-refused"
	if _, err := newLocker(t, c.client()).Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	c.must(m, "ACL", "SETUSER", "ops", "reset", "on", ">pw", "&*", "+@all", "-readwrite", "%R~*")
	l := newLocker(t, c.client(func(o *goredis.ClusterOptions) { o.ReadOnly, o.Username, o.Password = true, "ops", "pw" }))
	if _, err := l.Inspect(ctx, key); err == nil {
		t.Fatal("Inspect by a user refused READWRITE, on a ReadOnly client: nil")
	}
	c.must(m, "ACL", "SETUSER", "ops", "+readwrite")
	if in, err := l.Inspect(ctx, key); err != nil || len(in.Holders) != 1 {
		t.Errorf("Inspect once READWRITE is granted: %+v, %v; want the holder", in, err)
	}
}
