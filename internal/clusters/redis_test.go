//go:build clusters

package clusters

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/redislock"
	"github.com/warden-go/warden/guard"
)

// quietRedis drops go-redis's own messages (refused connections during a
// failover), which would bury the test's output.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

func init() { goredis.SetLogger(quietRedis{}) }

// redisAdmin talks to each node of the Redis Cluster on its own, to ask
// what that node thinks (its role, its view of the slots) and to run the
// commands that operate the cluster.
type redisAdmin struct {
	t       *testing.T
	addrs   []string
	clients map[string]*goredis.Client
}

func newRedisAdmin(t *testing.T) *redisAdmin {
	t.Helper()
	requireUp(t, "WARDEN_CLUSTER_REDIS")
	a := &redisAdmin{t: t, addrs: addrs("WARDEN_CLUSTER_REDIS"), clients: map[string]*goredis.Client{}}
	for _, addr := range a.addrs {
		// No retries and short timeouts: a question to a dead node must
		// fail at once, so that polls move on.
		c := goredis.NewClient(&goredis.Options{Addr: addr, DialTimeout: 500 * time.Millisecond,
			ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second, MaxRetries: -1, PoolSize: 2})
		t.Cleanup(func() { c.Close() })
		a.clients[addr] = c
	}
	return a
}

func (a *redisAdmin) c(addr string) *goredis.Client { return a.clients[addr] }

func ctx2s() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 2*time.Second)
}

// clusterNode is one line of CLUSTER NODES.
type clusterNode struct {
	id, addr string
	flags    string
	master   string // the master's id, for a replica
	slots    [][2]int
}

func (n clusterNode) is(flag string) bool { return slices.Contains(strings.Split(n.flags, ","), flag) }
func (n clusterNode) failing() bool       { return n.is("fail") || n.is("fail?") }

func (n clusterNode) serves(slot int) bool {
	for _, r := range n.slots {
		if slot >= r[0] && slot <= r[1] {
			return true
		}
	}
	return false
}

func parseClusterNodes(text string) []clusterNode {
	var nodes []clusterNode
	for line := range strings.SplitSeq(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		n := clusterNode{id: f[0], addr: addr, flags: f[2], master: f[3]}
		for _, s := range f[8:] {
			if strings.HasPrefix(s, "[") { // a slot being migrated or imported
				continue
			}
			lo, hi, isRange := strings.Cut(s, "-")
			a, err1 := strconv.Atoi(lo)
			b := a
			var err2 error
			if isRange {
				b, err2 = strconv.Atoi(hi)
			}
			if err1 == nil && err2 == nil {
				n.slots = append(n.slots, [2]int{a, b})
			}
		}
		nodes = append(nodes, n)
	}
	return nodes
}

func (a *redisAdmin) view(addr string) ([]clusterNode, error) {
	ctx, cancel := ctx2s()
	defer cancel()
	text, err := a.c(addr).ClusterNodes(ctx).Result()
	if err != nil {
		return nil, err
	}
	return parseClusterNodes(text), nil
}

// owner returns the master serving slot and its replica, as node from sees
// them.
func (a *redisAdmin) owner(from string, slot int) (master, replica clusterNode, err error) {
	nodes, err := a.view(from)
	if err != nil {
		return master, replica, err
	}
	for _, n := range nodes {
		if n.is("master") && n.serves(slot) && !n.failing() {
			master = n
		}
	}
	if master.id == "" {
		return master, replica, fmt.Errorf("%s knows no live master for slot %d", from, slot)
	}
	for _, n := range nodes {
		if n.is("slave") && n.master == master.id && !n.failing() {
			replica = n
		}
	}
	return master, replica, nil
}

func (a *redisAdmin) masters(from string) ([]clusterNode, error) {
	nodes, err := a.view(from)
	if err != nil {
		return nil, err
	}
	var ms []clusterNode
	for _, n := range nodes {
		if n.is("master") && len(n.slots) > 0 && !n.failing() {
			ms = append(ms, n)
		}
	}
	slices.SortFunc(ms, func(x, y clusterNode) int { return strings.Compare(x.addr, y.addr) })
	return ms, nil
}

func (a *redisAdmin) info(addr, field string) string {
	ctx, cancel := ctx2s()
	defer cancel()
	text, err := a.c(addr).Info(ctx, "replication").Result()
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(text, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

func (a *redisAdmin) role(addr string) string {
	ctx, cancel := ctx2s()
	defer cancel()
	r, err := a.c(addr).Do(ctx, "ROLE").Slice()
	if err != nil || len(r) == 0 {
		return ""
	}
	s, _ := r[0].(string)
	return s
}

// healthy reports why the cluster is not whole: every node up, all slots
// served as every node sees it, nobody flagged failing, every replica
// linked to its master.
func (a *redisAdmin) healthy() error {
	for _, addr := range a.addrs {
		ctx, cancel := ctx2s()
		info, err := a.c(addr).ClusterInfo(ctx).Result()
		cancel()
		if err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
		for _, want := range []string{"cluster_state:ok", "cluster_slots_ok:16384", fmt.Sprintf("cluster_known_nodes:%d", len(a.addrs))} {
			if !strings.Contains(info, want) {
				return fmt.Errorf("%s: CLUSTER INFO lacks %s", addr, want)
			}
		}
		nodes, err := a.view(addr)
		if err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
		for _, n := range nodes {
			if n.failing() {
				return fmt.Errorf("%s sees %s as %s", addr, n.addr, n.flags)
			}
		}
		if a.role(addr) == "slave" && a.info(addr, "master_link_status") != "up" {
			return fmt.Errorf("%s: replica not linked to its master", addr)
		}
	}
	return nil
}

func (a *redisAdmin) waitHealthy(within time.Duration) time.Time {
	a.t.Helper()
	var last error
	at, err := poll(within, func() bool { last = a.healthy(); return last == nil })
	if err != nil {
		a.t.Fatalf("the Redis Cluster is not whole after %v: %v (run scripts/clusters.sh up)", within, last)
	}
	return at
}

// contender is a client as an application has it: a ClusterClient with
// go-redis's default options over every node.
func (a *redisAdmin) contender(int) (contender, error) {
	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: a.addrs})
	l, err := redislock.New(c)
	if err != nil {
		c.Close()
		return contender{}, err
	}
	return contender{locker: l, close: func() error { return errors.Join(l.Close(), c.Close()) }}, nil
}

// escapeTag is redistag.Escape (backends/internal, out of reach here): '%',
// '{' and '}' percent-encoded, so that the hash tag stays whole.
func escapeTag(s string) string {
	return strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D").Replace(s)
}

// keySlot is Redis Cluster's HASH_SLOT: CRC16 (XMODEM) of the hash tag, or
// of the whole key without one, modulo 16384.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

// lockKeys returns the Redis keys of the scenario's lock (see
// backends/redislock/keys.go) and their slot, checked against the server's
// CLUSTER KEYSLOT.
func (a *redisAdmin) lockKeys(s *scenario) (tag, lockKey, fenceKey string, slot int) {
	a.t.Helper()
	tag = "{" + escapeTag(s.prefix+s.key) + "}"
	// The lock's state is also its fence, the one key a lock leaves.
	lockKey, fenceKey = tag+":lock", tag+":lock"
	slot = keySlot(lockKey)
	for _, k := range []string{lockKey, fenceKey} {
		ctx, cancel := ctx2s()
		server, err := a.c(a.addrs[0]).ClusterKeySlot(ctx, k).Result()
		cancel()
		if err != nil {
			a.t.Fatal(err)
		}
		if int(server) != slot {
			a.t.Fatalf("slot of %q: computed %d, CLUSTER KEYSLOT says %d", k, slot, server)
		}
	}
	return tag, lockKey, fenceKey, slot
}

// waitLockOn waits until the lock key is seen on master: it proves the key
// layout and the slot the test works out are the ones warden uses.
func (a *redisAdmin) waitLockOn(master, lockKey string) {
	a.t.Helper()
	waitFor(a.t, 10*time.Second, fmt.Sprintf("%s to hold %s", master, lockKey), func() bool {
		ctx, cancel := ctx2s()
		defer cancel()
		n, err := a.c(master).Exists(ctx, lockKey).Result()
		return err == nil && n == 1
	})
}

// leftovers lists the keys of the run's lock on any master other than the
// fence (the lock's state), which outlives the lock by a day or two by
// design (redislock's doc).
func (a *redisAdmin) leftovers(slot int, tag, fenceKey string) error {
	ms, err := a.masters(a.addrs[0])
	if err != nil {
		return err
	}
	var left []string
	for _, m := range ms {
		ctx, cancel := ctx2s()
		keys, err := a.c(m.addr).ClusterGetKeysInSlot(ctx, slot, 1000).Result()
		cancel()
		if err != nil {
			return fmt.Errorf("%s: %w", m.addr, err)
		}
		for _, k := range keys {
			if strings.HasPrefix(k, tag) && k != fenceKey {
				left = append(left, m.addr+" "+k)
			}
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("keys %v", left)
	}
	return nil
}

// dropFence deletes the run's fence counter, the one key a lock leaves by
// design, so that runs do not accumulate them.
func (a *redisAdmin) dropFence(slot int, fenceKey string) {
	if m, _, err := a.owner(a.addrs[0], slot); err == nil {
		ctx, cancel := ctx2s()
		defer cancel()
		a.c(m.addr).Del(ctx, fenceKey)
	}
}

func (a *redisAdmin) describe(lockKey string) func() string {
	return func() string {
		var b strings.Builder
		for _, addr := range a.addrs {
			ctx, cancel := ctx2s()
			pttl, err := a.c(addr).PTTL(ctx, lockKey).Result()
			cancel()
			fmt.Fprintf(&b, "\n  %s role %q link %q; PTTL of the lock %v (err %v)", addr, a.role(addr),
				a.info(addr, "master_link_status"), pttl, err)
		}
		if nodes, err := a.view(a.addrs[0]); err == nil {
			for _, n := range nodes {
				fmt.Fprintf(&b, "\n  %s %s %s", n.addr, n.flags, fmt.Sprint(n.slots))
			}
		}
		return b.String()
	}
}

// TestRedisClusterFailover runs the workload on three keys, one on each
// master, with the four clients shared among them as one process's Locker
// serves all its locks; then kills the master that serves one of the keys
// and, of the three, hosts the most wake-up subscriptions, with its replica
// made to lag first, so that the replica promoted in its place has missed
// the latest grants (the lost-write case); then starts the old master again,
// which rejoins as a replica. The clients are ClusterClients with default
// options: warden must find the new master by itself, and its waiters,
// also those of keys the dead master never served, must not sit on a free
// lock for more than freeBound once the cluster serves again.
func TestRedisClusterFailover(t *testing.T) { redisFailover(t, "redis-failover") }

// TestRedisClusterFailoverFair is TestRedisClusterFailover with fair
// (queued) acquisitions, whose queue the promoted replica may have missed:
// it still queues the waiters that the lost grants let in, ahead of the live
// ones, and the live ones must get past them within the bound.
func TestRedisClusterFailoverFair(t *testing.T) {
	redisFailover(t, "redis-failover-fair", guard.Fair())
}

// processes are the four clients of a Redis scenario, each a ClusterClient
// with default options and one Locker, shared by the scenario's keys as in
// an application: one Locker's wake-up subscription serves the waiters of
// all its keys. Each is closed once every scenario that uses it is done.
type processes struct {
	mu     sync.Mutex
	cs     []contender
	refs   []int
	closed []bool
}

func (a *redisAdmin) processes() *processes {
	a.t.Helper()
	p := &processes{refs: make([]int, contenders), closed: make([]bool, contenders)}
	a.t.Cleanup(func() {
		for i := range p.cs {
			p.close(i)
		}
	})
	for i := range contenders {
		c, err := a.contender(i)
		if err != nil {
			a.t.Fatalf("client %d: %v", i, err)
		}
		p.cs = append(p.cs, c)
	}
	return p
}

func (p *processes) close(i int) error {
	p.mu.Lock()
	done := p.closed[i]
	p.closed[i] = true
	p.mu.Unlock()
	if done {
		return nil
	}
	return p.cs[i].close()
}

// contender hands out the i-th client for one more scenario.
func (p *processes) contender(i int) (contender, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refs[i]++
	return contender{locker: p.cs[i].locker, every: jobEvery, close: func() error {
		p.mu.Lock()
		p.refs[i]--
		last := p.refs[i] == 0
		p.mu.Unlock()
		if !last {
			return nil
		}
		return p.close(i)
	}}, nil
}

// jobEvery is how often every client of a Redis scenario asks for each
// key, all at the same moment: each round is four grants, three of them
// handed over by a release that wakes a waiter, and no newcomer comes
// before the next round, longer than freeBound later, so that a waiter that
// does not hear of a release is seen sitting on the free lock; short enough
// that the lock idle between rounds stays well within the bound on the
// time without a grant (the TTL and a second).
const jobEvery = freeBound * 3 / 2

// redisKey is one key of a Redis scenario and what serves it.
type redisKey struct {
	s                      *scenario
	tag, lockKey, fenceKey string
	slot                   int
	master                 clusterNode
}

// startRedisKeys starts one scenario per master, named name@<its port>,
// each on a key its master serves, all on the same processes, with the
// free-while-waiting row judged.
func (a *redisAdmin) startRedisKeys(name string, ttl time.Duration, opts ...guard.LockOption) []*redisKey {
	a.t.Helper()
	procs := a.processes()
	ms, err := a.masters(a.addrs[0])
	if err != nil || len(ms) == 0 {
		a.t.Fatalf("masters: %v, %v", ms, err)
	}
	var keys []*redisKey
	for _, m := range ms {
		_, port, _ := net.SplitHostPort(m.addr)
		sn := name + "@" + port
		key := ""
		for i := 0; key == ""; i++ {
			k := fmt.Sprintf("orders{eu}/close-%d", i)
			if m.serves(keySlot("{" + escapeTag(prefixOf(sn)+k) + "}:lock")) {
				key = k
			}
		}
		s := startScenario(a.t, sn, key, ttl, procs.contender, opts...)
		s.judgeFree = true
		rk := &redisKey{s: s, master: m}
		rk.tag, rk.lockKey, rk.fenceKey, rk.slot = a.lockKeys(s)
		s.diagnose = a.describe(rk.lockKey)
		a.waitLockOn(m.addr, rk.lockKey)
		keys = append(keys, rk)
	}
	return keys
}

// wakeSubscriptions counts, on the node at addr, the Lockers' wake-up
// channels with a subscriber there.
func (a *redisAdmin) wakeSubscriptions(addr string) int {
	ctx, cancel := ctx2s()
	defer cancel()
	chs, _ := a.c(addr).PubSubChannels(ctx, "warden:wake:*").Result()
	return len(chs)
}

// watchClusterDown polls the masters of keys other than victim's from now
// until the returned func is called, which returns, by master, when each
// first said cluster_state:fail: until then it served its keys.
func (a *redisAdmin) watchClusterDown(keys []*redisKey, victim *redisKey) func() map[string]time.Time {
	stop := make(chan struct{})
	var mu sync.Mutex
	down := map[string]time.Time{}
	var wg sync.WaitGroup
	for _, k := range keys {
		if k == victim {
			continue
		}
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				ctx, cancel := ctx2s()
				info, err := a.c(k.master.addr).ClusterInfo(ctx).Result()
				cancel()
				if err == nil && strings.Contains(info, "cluster_state:fail") {
					mu.Lock()
					down[k.master.addr] = time.Now()
					mu.Unlock()
					return
				}
			}
		})
	}
	return func() map[string]time.Time {
		close(stop)
		wg.Wait()
		return down
	}
}

func (k *redisKey) finish(a *redisAdmin, ttl time.Duration) {
	k.s.finish(func() error { return a.leftovers(k.slot, k.tag, k.fenceKey) }, ttl+10*time.Second)
	a.dropFence(k.slot, k.fenceKey)
}

func redisFailover(t *testing.T, name string, opts ...guard.LockOption) {
	const ttl = 2 * time.Second
	a := newRedisAdmin(t)
	faults := newFaultGuard(t)
	a.waitHealthy(90 * time.Second)

	keys := a.startRedisKeys(name, ttl, opts...)
	// The master to kill: the one where most Lockers' wake-up channels
	// are subscribed, so that the fault takes waiters' subscriptions with
	// it, also those of keys on the other masters.
	victim, subs := keys[0], -1
	for _, k := range keys {
		if n := a.wakeSubscriptions(k.master.addr); n > subs {
			victim, subs = k, n
		}
	}
	s, master := victim.s, victim.master
	_, replica, err := a.owner(a.addrs[0], victim.slot)
	if err != nil || replica.id == "" {
		t.Fatalf("slot %d: master %v, replica %v, err %v", victim.slot, master, replica, err)
	}
	t.Logf("lock key %s, slot %d, master %s, replica %s; %d of %d Lockers subscribed there", victim.lockKey,
		victim.slot, master.addr, replica.addr, subs, contenders)
	for _, k := range keys {
		if k == victim {
			k.s.note("its key is on the master killed, where %d of %d Lockers had their wake-up subscription", subs, contenders)
		} else {
			k.s.note("its key is on a master that stays up; %d of %d Lockers had their wake-up subscription on the one killed", subs, contenders)
		}
	}

	// The lag: the replica frozen, and its link cut on the master's side,
	// so that the grants from now on reach neither its socket nor its
	// memory. Then the master dies before the replica can catch up.
	mnode, rnode := nodeAt("redis", master.addr, "redis-server"), nodeAt("redis", replica.addr, "redis-server")
	faults.stop(rnode)
	ctx, cancel := ctx2s()
	err = a.c(master.addr).ClientKillByFilter(ctx, "TYPE", "replica").Err()
	cancel()
	if err != nil {
		t.Fatalf("CLIENT KILL TYPE replica on %s: %v", master.addr, err)
	}
	cut := time.Now()
	waitFor(t, 10*time.Second, "grants on the master after its replica's link was cut", func() bool {
		return s.store.grantsSince(cut) >= 3
	})
	offset, _ := strconv.ParseInt(a.info(master.addr, "master_repl_offset"), 10, 64)
	at := faults.kill(mnode)
	down := a.watchClusterDown(keys, victim)
	faults.cont(rnode)
	ready := waitFor(t, 30*time.Second, replica.addr+" promoted", func() bool { return a.role(replica.addr) == "master" })
	servedUntil := down()
	// second_repl_offset is where the promoted replica's history forks
	// from the old master's, one past the last byte it had.
	if second, err := strconv.ParseInt(a.info(replica.addr, "second_repl_offset"), 10, 64); err == nil && second > 0 {
		if missed := offset - (second - 1); missed > 0 {
			s.note("lost-write case produced: the promoted replica missed at least %d bytes of the master's replication stream (its grants since the link was cut)", missed)
		} else {
			s.note("the replica had caught up (offset %d, master %d): no lost write this time", second-1, offset)
		}
	}
	// What the promoted replica holds of the lock: fair waiters it still
	// queues may be acquisitions long over on the lost master, and a lock
	// it still holds is nobody's the workers know of.
	ctx, cancel = ctx2s()
	queue, _ := a.c(replica.addr).LRange(ctx, victim.tag+":queue", 0, -1).Result()
	deadlines, _ := a.c(replica.addr).ZRangeWithScores(ctx, victim.tag+":queue:deadlines", 0, -1).Result()
	pttl, _ := a.c(replica.addr).PTTL(ctx, victim.lockKey).Result()
	cancel()
	if len(queue) > 0 || pttl > 0 {
		var left []string
		now := float64(time.Now().UnixMilli())
		for _, z := range deadlines {
			left = append(left, fmt.Sprintf("%.0fms", z.Score-now))
		}
		s.note("at promotion the new master had the lock for %v more and %d queued waiters, whose places lapse in %v",
			pttl, len(queue), left)
	}
	for _, k := range keys {
		e := event{name: "SIGKILL master " + mnode.name + " (replica lagging)", at: at, ready: ready}
		if k == victim && pttl > 0 {
			e.heldUntil = ready.Add(pttl)
		}
		if k != victim {
			e.servedUntil = servedUntil[k.master.addr]
			if e.servedUntil.IsZero() {
				e.servedUntil = ready
			}
			k.s.note("its master went on serving it for %v after the kill, until it declared the cluster down",
				e.servedUntil.Sub(at).Round(time.Millisecond))
		}
		k.s.event(e)
	}
	for _, k := range keys {
		k.s.settle(at, ttl+time.Second)
	}

	at = time.Now()
	faults.start(mnode)
	ready = a.waitHealthy(90 * time.Second)
	for _, k := range keys {
		k.s.event(event{name: "restart " + mnode.name + " (rejoins as replica)", at: at, ready: ready})
	}
	for _, k := range keys {
		k.s.settle(at, time.Second)
	}
	for _, k := range keys {
		k.finish(a, ttl)
	}
}

// migrateSlot moves slot from src to dst while the workload runs, as
// redis-cli --cluster reshard does, one key at a time with pauses, as a
// slot with many keys would take: IMPORTING on dst, MIGRATING on src, MIGRATE
// of each key, then the slot assigned to dst on every master.
func (a *redisAdmin) migrateSlot(slot int, src, dst clusterNode) {
	a.t.Helper()
	do := func(addr string, args ...any) *goredis.Cmd {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return a.c(addr).Do(ctx, args...)
	}
	must := func(addr string, args ...any) {
		if err := do(addr, args...).Err(); err != nil {
			a.t.Fatalf("%s: %v: %v", addr, args, err)
		}
	}
	must(dst.addr, "CLUSTER", "SETSLOT", slot, "IMPORTING", src.id)
	must(src.addr, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst.id)
	host, port, _ := net.SplitHostPort(dst.addr)
	time.Sleep(300 * time.Millisecond) // the fault's shape, not an outcome: locks come and go mid-migration
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := ctx2s()
		keys, err := a.c(src.addr).ClusterGetKeysInSlot(ctx, slot, 1).Result()
		cancel()
		if err != nil {
			a.t.Fatalf("GETKEYSINSLOT on %s: %v", src.addr, err)
		}
		if len(keys) == 0 {
			break
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("slot %d still has keys on %s after 30s: %v", slot, src.addr, keys)
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := do(src.addr, args...).Err(); err != nil && !strings.Contains(err.Error(), "NOKEY") {
			a.t.Fatalf("MIGRATE %v from %s to %s: %v", keys, src.addr, dst.addr, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	must(dst.addr, "CLUSTER", "SETSLOT", slot, "NODE", dst.id)
	must(src.addr, "CLUSTER", "SETSLOT", slot, "NODE", dst.id)
	ms, err := a.masters(dst.addr)
	if err != nil {
		a.t.Fatal(err)
	}
	for _, m := range ms {
		if m.id != src.id && m.id != dst.id {
			must(m.addr, "CLUSTER", "SETSLOT", slot, "NODE", dst.id)
		}
	}
	waitFor(a.t, 10*time.Second, fmt.Sprintf("every node to see slot %d on %s", slot, dst.addr), func() bool {
		for _, addr := range a.addrs {
			if m, _, err := a.owner(addr, slot); err != nil || m.id != dst.id {
				return false
			}
		}
		return true
	})
}

// TestRedisClusterSlotMigration moves the slot of one of the three keys
// (one on each master, the clients shared among them) from master to
// master, and back, while the lock is taken and released on it.
func TestRedisClusterSlotMigration(t *testing.T) { redisMigration(t, "redis-migration") }

// TestRedisClusterSlotMigrationFair is TestRedisClusterSlotMigration with
// fair (queued) acquisitions: more keys of the lock to move.
func TestRedisClusterSlotMigrationFair(t *testing.T) {
	redisMigration(t, "redis-migration-fair", guard.Fair())
}

func redisMigration(t *testing.T, name string, opts ...guard.LockOption) {
	const ttl = 2 * time.Second
	a := newRedisAdmin(t)
	a.waitHealthy(90 * time.Second)

	keys := a.startRedisKeys(name, ttl, opts...)
	moved := keys[0]
	src := moved.master
	// Away to another master, then back, so that the cluster ends as it
	// began.
	away := keys[1].master
	for _, k := range keys {
		if k == moved {
			k.s.note("its key's slot %d moves %s→%s→%s", k.slot, src.addr, away.addr, src.addr)
		} else {
			k.s.note("its key stays on %s while slot %d moves", k.master.addr, moved.slot)
		}
	}
	for _, dst := range []clusterNode{away, src} {
		at := time.Now()
		a.migrateSlot(moved.slot, src, dst)
		ready := time.Now()
		for _, k := range keys {
			k.s.event(event{name: fmt.Sprintf("migrate slot %d %s→%s", moved.slot, src.addr, dst.addr), at: at, ready: ready})
		}
		for _, k := range keys {
			k.s.settle(ready, ttl+time.Second)
		}
		a.waitLockOn(dst.addr, moved.lockKey)
		src = dst
	}
	for _, k := range keys {
		k.finish(a, ttl)
	}
}
