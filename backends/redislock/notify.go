package redislock

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/internal/redisrefusal"
	"github.com/warden-go/warden/guard/driver"
)

// notifier shares one Pub/Sub connection, and one subscription per channel,
// among all the Locker's waiters. A release message wakes one local waiter
// (or the waiter it names), never all of them: the others keep sleeping, so
// a process does not stampede the server after every release.
//
// A wake-up can be lost: while the subscription is not yet confirmed, while
// the connection is down (a Cluster client subscribes through one node, the
// master of the first channel's slot, and a dead node takes the
// subscriptions of every key with it), or when the connection is dead
// without saying so (a frozen node), or deaf (its node removed from the
// Cluster, see probe). So the notifier tells its waiters
// whether their subscription is confirmed: one that is not makes them poll
// (see Locker.sleep), its loss wakes them to start polling, and its
// confirmation, again after a reconnection, wakes them, since messages may
// have been missed meanwhile. A connection
// that fails asks a Cluster client for its slot map again, so that
// go-redis, which reconnects and resubscribes by itself, goes to the node
// that serves now.
type notifier struct {
	client goredis.UniversalClient
	// probeScript, on a Cluster's client only, publishes the probe of
	// the connection (see probe).
	probeScript *goredis.Script
	// lost is called when the connection failed.
	lost func()

	closed chan struct{} // closed by close

	mu       sync.Mutex
	ps       *goredis.PubSub // nil while nobody waits
	subs     map[string]*subscription
	isClosed bool
	// ops are the Pub/Sub commands decided under mu, sent in that order by
	// one goroutine at a time (writing), so that no waiter, and no message
	// delivery, waits on a connection being dialed.
	ops     []psOp
	writing bool
	// home is the address of the node n.ps was found on (a probe's
	// PUBLISH its subscribers heard), "" while unknown; shunned, that of
	// the last node that did not take a probe. Both are of n.ps alone.
	home, shunned string
}

// psOp is a SUBSCRIBE, an UNSUBSCRIBE or the closing of a connection.
type psOp struct {
	ps       *goredis.PubSub
	kind     int
	channels []string
}

const (
	opSubscribe = iota
	opUnsubscribe
	opClose
)

// subscription is the process's interest in one channel.
type subscription struct {
	channel string
	ps      *goredis.PubSub // the connection it was made on
	refs    int
	// ready is closed once the server confirmed the subscription, and
	// gone once it is lost after that; each is replaced by an open one
	// when the other is closed. A waiter sleeps on the one that would
	// change what it should do.
	ready, gone chan struct{}
	isReady     bool
	// any holds at most one wake-up for whichever waiter without a name
	// (readers, writers, semaphores) takes it.
	any chan string
	// named has one wake-up channel per mutex waiter, by its id. What it
	// carries is "" for a wake-up, or the grant of a lock a release handed
	// to the waiter (see release.lua).
	named map[string]chan string
	// spare is the channel of a named waiter that left, emptied, for the
	// next one: a channel of strings is two allocations to make.
	spare chan string
	// linger drops the subscription a while after its last waiter left
	// (lingering): made once, and armed again each time, so that a wait
	// that leaves the subscription without waiters costs no timer to make.
	linger    *time.Timer
	lingering bool
}

// lingerFor keeps a subscription nobody waits on for a while, so that a key
// contended again and again is not subscribed anew (a round trip, and a
// connection when it was the only one) for every wait.
const lingerFor = 2 * time.Second

// healthEvery is how long the connection may stay silent before it is
// probed (see probe), and how long the probe may go unanswered before the
// connection is taken for dead and replaced: a frozen or cut-off node
// closes nothing.
const healthEvery = time.Second

// probeMessage is what a probe publishes: no waiter's name, so that it
// wakes nobody (see deliver).
const probeMessage = "warden:probe"

// maxReconnectPause caps the pause between attempts to get a failed
// connection back.
const maxReconnectPause = 250 * time.Millisecond

// receiveBound is the least time a receive is given: healthEvery of
// silence, and the dialing of a connection in its place. A receive is given
// at most maxReconnectPause more (see receive).
const receiveBound = healthEvery + maxReconnectPause

func newNotifier(client goredis.UniversalClient, lost func()) *notifier {
	n := &notifier{client: client, lost: lost, closed: make(chan struct{}), subs: make(map[string]*subscription)}
	if _, ok := client.(*goredis.ClusterClient); ok {
		// KEYS[1] is a key of the slot the script must run in, which it
		// does not touch.
		n.probeScript = goredis.NewScript("return redis.call('publish', ARGV[1], ARGV[2])")
	}
	return n
}

// close ends the Pub/Sub connection and every wait on it.
func (n *notifier) close() error {
	n.mu.Lock()
	if n.isClosed {
		n.mu.Unlock()
		return nil
	}
	n.isClosed = true
	close(n.closed)
	for _, s := range n.subs {
		if s.linger != nil {
			s.linger.Stop()
		}
	}
	clear(n.subs)
	if n.ps != nil {
		// Queued, not waited for: the connection may be being dialed to a
		// node that does not answer, and the waits end with closed anyway.
		n.send(psOp{ps: n.ps, kind: opClose})
		n.ps = nil
	}
	n.mu.Unlock()
	return nil
}

// joinIfActive registers a waiter on a subscription that is already
// confirmed, at no cost, or returns nil. Joining before the first attempt
// means that no release after that attempt can go unnoticed. The channel
// returned is the one the waiter sleeps on; others reports whether local
// waiters were already there.
func (n *notifier) joinIfActive(channel, id string) (s *subscription, wake <-chan string, others bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	s = n.subs[channel]
	if s == nil || !s.isReady {
		return nil, nil, false
	}
	others = s.refs > 0
	return s, n.register(s, id), others
}

// join registers a waiter, subscribing to channel if this process is not yet
// subscribed, and returns once the server confirmed the subscription, or
// after within without a confirmation: the waiter then polls until there is
// one (see watch).
func (n *notifier) join(ctx context.Context, channel, id string, within time.Duration) (*subscription, <-chan string, error) {
	n.mu.Lock()
	if n.isClosed {
		n.mu.Unlock()
		return nil, nil, errClosed
	}
	s := n.subs[channel]
	if s == nil {
		if n.ps == nil {
			// Without channels, Subscribe only makes the PubSub: the
			// connection is dialed by the SUBSCRIBE, off this goroutine.
			n.ps = n.client.Subscribe(context.WithoutCancel(ctx))
			n.home, n.shunned = "", ""
			go n.receive(n.ps, channel)
		}
		s = &subscription{
			channel: channel,
			ps:      n.ps,
			ready:   make(chan struct{}),
			gone:    make(chan struct{}),
			any:     make(chan string, 1),
			named:   make(map[string]chan string),
		}
		n.subs[channel] = s
		n.send(psOp{ps: n.ps, kind: opSubscribe, channels: []string{channel}})
	}
	wake := n.register(s, id)
	ready := s.ready
	n.mu.Unlock()

	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case <-ready:
	case <-timer.C:
	case <-ctx.Done():
		n.leave(s, id, false)
		return nil, nil, ctx.Err()
	case <-n.closed:
		return nil, nil, errClosed
	}
	return s, wake, nil
}

// watch reports whether s is confirmed, and returns a channel closed when
// that changes. A waiter whose subscription is not confirmed may miss the
// message meant for it, so it polls until it is, and one whose
// subscription is lost while it sleeps must start polling at once.
func (n *notifier) watch(s *subscription) (changed <-chan struct{}, confirmed bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if s.isReady {
		return s.gone, true
	}
	return s.ready, false
}

// unready marks s lost; n.mu is held.
func (s *subscription) unready() {
	if s.isReady {
		s.isReady = false
		s.ready = make(chan struct{})
		close(s.gone)
	}
}

// register counts a waiter in and returns the channel it sleeps on: its own
// for a named waiter (id != ""), the shared one otherwise.
func (n *notifier) register(s *subscription, id string) <-chan string {
	if s.refs == 0 && s.lingering {
		s.lingering = false
		s.linger.Stop()
		// A release nobody was waiting for: the newcomer tries first anyway.
		select {
		case <-s.any:
		default:
		}
	}
	s.refs++
	if id == "" {
		return s.any
	}
	c := s.spare
	if c == nil {
		c = make(chan string, 1)
	}
	s.spare = nil
	s.named[id] = c
	return c
}

// leave unregisters a waiter. passOn hands a wake-up the waiter consumed but
// did not use to the next local waiter, so that a waiter that gives up right
// after being woken cannot strand the others.
func (n *notifier) leave(s *subscription, id string, passOn bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if c := s.named[id]; c != nil {
		delete(s.named, id)
		// A wake-up the waiter did not take is nobody's now: a grant
		// among them is given back by the waiter's cleanup.
		select {
		case <-c:
		default:
		}
		s.spare = c
	}
	if passOn {
		select {
		case s.any <- "":
		default:
		}
	}
	s.refs--
	if s.refs > 0 || n.isClosed {
		return
	}
	s.lingering = true
	if s.linger == nil {
		s.linger = time.AfterFunc(lingerFor, func() { n.lingered(s) })
	} else {
		s.linger.Reset(lingerFor)
	}
}

// lingered drops s when it is still without waiters at the end of its
// linger.
func (n *notifier) lingered(s *subscription) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if s.refs == 0 && s.lingering && n.subs[s.channel] == s {
		n.drop(s)
	}
}

// drop ends a subscription nobody waits on, and the connection with the last.
func (n *notifier) drop(s *subscription) {
	delete(n.subs, s.channel)
	if s.ps != n.ps {
		return // its connection is already gone
	}
	if len(n.subs) == 0 {
		n.send(psOp{ps: n.ps, kind: opClose})
		n.ps = nil
		return
	}
	n.send(psOp{ps: n.ps, kind: opUnsubscribe, channels: []string{s.channel}})
}

// send queues a Pub/Sub command; n.mu is held.
func (n *notifier) send(op psOp) {
	n.ops = append(n.ops, op)
	if !n.writing {
		n.writing = true
		go n.write()
	}
}

// write sends the queued commands in order. Their errors are not final:
// go-redis records the channels before it writes, and subscribes to them
// again on the connection it makes after a failure.
func (n *notifier) write() {
	for {
		n.mu.Lock()
		if len(n.ops) == 0 {
			n.writing = false
			n.mu.Unlock()
			return
		}
		op := n.ops[0]
		n.ops = n.ops[1:]
		n.mu.Unlock()
		ctx := context.Background()
		switch op.kind {
		case opSubscribe:
			_ = op.ps.Subscribe(ctx, op.channels...)
		case opUnsubscribe:
			_ = op.ps.Unsubscribe(ctx, op.channels...)
		case opClose:
			_ = op.ps.Close()
		}
	}
}

// receive dispatches the messages of one Pub/Sub connection until it is
// closed or replaced, and watches its health. first is the channel of its
// first SUBSCRIBE.
func (n *notifier) receive(ps *goredis.PubSub, first string) {
	n.guessHome(ps, first)
	pause := driver.Backoff{Max: maxReconnectPause}
	// probed is the answer of the probe sent after a silence (nil before
	// one); pinged, that the connection's own node was pinged after it.
	var probed <-chan bool
	pinged := false
	var rc receiveContext
	defer rc.stop()
	for {
		m, err := ps.ReceiveTimeout(rc.next(), healthEvery)
		if err != nil {
			if errors.Is(err, goredis.ErrClosed) || !n.current(ps) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				if probed == nil {
					probed = n.probe(ps)
					continue
				}
				// Silent through a whole period after a probe. When the
				// node that was to publish it did not take it (paused,
				// refused, another master than ps's), or has not answered
				// yet (a client that ignores the probe's deadline waits
				// out its read timeout, and ps is not left unread
				// meanwhile), the silence says nothing of ps's node: it is
				// pinged, and judged by that.
				if !pinged {
					took := false
					select {
					case took = <-probed:
					default:
					}
					if !took {
						pinged = true
						go n.ping(ps)
						continue
					}
				}
				// The connection is dead without knowing it, or deaf.
				n.replace(ps)
				return
			}
			// go-redis has dropped the connection and dials another at the
			// next Receive; until it has subscribed again, messages are
			// lost.
			n.disconnected(ps)
			select {
			case <-n.closed:
				return
			case <-time.After(pause.Next()):
			}
			continue
		}
		pause.Reset()
		probed, pinged = nil, false
		switch m := m.(type) {
		case *goredis.Subscription:
			if m.Kind == "subscribe" {
				n.confirmed(ps, m.Channel)
			}
		case *goredis.Message:
			n.deliver(ps, m.Channel, m.Payload)
		}
	}
}

// probe asks for a sign of life on ps, and answers on the channel it
// returns whether the node meant to send it took the request. Without a
// channel to probe on, that is a PING, which ps's node answers on ps. On a
// Cluster, that proves the node lives, not that it is still a member: a
// master emptied and removed (redis-cli --cluster del-node: the others
// forget it, it is reset) keeps its subscribers and answers their PINGs,
// but no release's PUBLISH reaches it any more. There the probe is a
// message that one of ps's confirmed channels carries from a member, which
// the cluster relays to every member, so that ps receives it only if its
// node is one. On the Locker's own channel, which only ps listens to, it
// is a PUBLISH sent to another master of the client's slot map than ps's
// node (see publisher): one command, where a script costs two. A master
// the map still names after its removal hears nobody else, and publishing
// there alone would be heard by ps only if ps is on it: PUBLISH counts the
// node's own subscribers that heard it, which finds ps's node out (home)
// and takes it out of the next choices. On another channel, which other
// processes hear too, that count finds out nothing: a script publishes the
// message on the node that serves a key of the channel's slot (a removed
// node serves none). The node meant to publish is often another master
// than ps's: one that does not answer (paused, frozen) or refuses for good
// (see redisrefusal: a user without the right to PUBLISH, the key or
// EVALSHA) tells nothing of ps, which receive then pings; one that did not
// answer is passed over next time when the map names another.
func (n *notifier) probe(ps *goredis.PubSub) <-chan bool {
	answered := make(chan bool, 1)
	channel := n.probeChannel(ps)
	if channel == "" {
		n.ping(ps)
		answered <- true
		return answered
	}
	// Off the receiving goroutine, which counts the probe's healthEvery
	// from now: a probe sent to a frozen master waits out its context.
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), healthEvery)
		defer cancel()
		if strings.HasPrefix(channel, wakePrefix) {
			if node := n.publisher(ctx, ps, channel); node != nil {
				addr := node.Options().Addr
				// Passed over until it answers: a client at go-redis's
				// defaults ignores ctx's deadline, and waits out its read
				// timeout for a paused node's answer, past the next probe.
				n.shun(ps, addr, true)
				heard, err := node.Publish(ctx, channel, probeMessage).Result()
				took := tookProbe(err)
				if took {
					n.shun(ps, addr, false)
				}
				if heard > 0 {
					n.setHome(ps, addr)
				}
				answered <- took
				return
			}
		}
		key := channel
		if !strings.HasPrefix(key, "{") {
			// The Locker's own channel has no hash tag: the key takes the
			// channel's name for one, which keeps it under the ACL
			// pattern of lock keys for guard's default prefix
			// ({warden:*).
			key = "{" + key + "}"
		}
		answered <- tookProbe(n.probeScript.Run(ctx, n.client, []string{key}, channel, probeMessage).Err())
	}()
	return answered
}

// tookProbe reports whether a probe's PUBLISH, answered err, was taken.
// Any answer but a refusal for good is: a stale slot map's CLUSTERDOWN or
// MOVED too, a silence of a connection that may be deaf.
func tookProbe(err error) bool {
	return err == nil || (isReply(err) && !redisrefusal.Permanent(err))
}

// publisherTries is how many slots publisher looks at for a master.
const publisherTries = 16

// publisher is the master of the client's slot map to publish ps's probe
// on channel from: one of the masters of a few slots (the channel's own,
// then others, the same ones each time) that is not ps's node, nor the one
// that did not take the last probe, when another is named; nil when the
// map names none but ps's node. The map is the client's own, read without
// a command: a master it names may have been removed since, which hears
// nothing and gets ps replaced for nothing, once, the map loaded again
// then (lost).
func (n *notifier) publisher(ctx context.Context, ps *goredis.PubSub, channel string) *goredis.Client {
	n.mu.Lock()
	home, shunned := n.home, n.shunned
	n.mu.Unlock()
	cc := n.client.(*goredis.ClusterClient)
	var passed *goredis.Client
	for i := range publisherTries {
		key := channel
		if i > 0 {
			key += strconv.Itoa(i)
		}
		node, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return passed
		}
		switch node.Options().Addr {
		case home:
		case shunned:
			passed = node
		default:
			return node
		}
	}
	return passed
}

// setHome records that ps is on the node at addr: its own subscribers
// heard a probe it published.
func (n *notifier) setHome(ps *goredis.PubSub, addr string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ps == ps {
		n.home = addr
	}
}

// guessHome takes the master of first's slot for ps's node, as go-redis
// dials it there for its first SUBSCRIBE, so that no probe of ps is
// published on its own node, whose subscribers hear it without the
// cluster. (When go-redis dials before the first SUBSCRIBE is written, or
// again after a failure, the node is another: the first probe published
// there finds it out.)
func (n *notifier) guessHome(ps *goredis.PubSub, first string) {
	if n.probeScript == nil || first == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), healthEvery)
	defer cancel()
	if node, err := n.client.(*goredis.ClusterClient).MasterForKey(ctx, first); err == nil {
		n.setHome(ps, node.Options().Addr)
	}
}

// shun makes the node at addr the one ps's next probe passes over, or,
// with !on, the node passed over no longer, if it is that one.
func (n *notifier) shun(ps *goredis.PubSub, addr string, on bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case n.ps != ps:
	case on:
		n.shunned = addr
	case n.shunned == addr:
		n.shunned = ""
	}
}

// ping sends a PING on ps, which its node answers on ps.
func (n *notifier) ping(ps *goredis.PubSub) {
	ctx, cancel := context.WithTimeout(context.Background(), healthEvery)
	defer cancel()
	_ = ps.Ping(ctx)
}

// probeChannel is the channel to probe ps on, or "" when ps is not a
// Cluster's or has no confirmed channel: the Locker's own channel, which
// only this process hears, when it is confirmed, or another.
func (n *notifier) probeChannel(ps *goredis.PubSub) string {
	if n.probeScript == nil {
		return ""
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	var found string
	for channel, s := range n.subs {
		if s.ps != ps || !s.isReady {
			continue
		}
		if strings.HasPrefix(channel, wakePrefix) {
			return channel
		}
		found = channel
	}
	return found
}

// receiveContext is the context of one connection's receives. go-redis
// dials again inside ReceiveTimeout when the connection failed, before it
// tells: the context's deadline bounds that, so that a loss is told to the
// waiters even when the node it dials does not answer. One context serves
// the receives that follow while it leaves them receiveBound, so that a
// message costs no timer to make, nor to stop before it is delivered.
type receiveContext struct {
	ctx      context.Context
	cancel   context.CancelFunc
	deadline time.Time
}

// next is the context of the next receive.
func (r *receiveContext) next() context.Context {
	if r.ctx == nil || time.Until(r.deadline) < receiveBound {
		r.stop()
		r.deadline = time.Now().Add(receiveBound + maxReconnectPause)
		r.ctx, r.cancel = context.WithDeadline(context.Background(), r.deadline)
	}
	return r.ctx
}

func (r *receiveContext) stop() {
	if r.cancel != nil {
		r.cancel()
	}
}

// current reports whether ps is still the notifier's connection.
func (n *notifier) current(ps *goredis.PubSub) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ps == ps && !n.isClosed
}

// disconnected marks the subscriptions of ps as lost: their waiters poll
// until the server confirms them again.
func (n *notifier) disconnected(ps *goredis.PubSub) {
	n.mu.Lock()
	for _, s := range n.subs {
		if s.ps == ps {
			s.unready()
		}
	}
	n.mu.Unlock()
	n.lost()
}

// replace swaps a connection taken for dead for a new one, subscribed to
// every channel of the old.
func (n *notifier) replace(old *goredis.PubSub) {
	n.mu.Lock()
	if n.ps != old || n.isClosed {
		n.mu.Unlock()
		return
	}
	n.ps = n.client.Subscribe(context.Background())
	n.home, n.shunned = "", ""
	channels := make([]string, 0, len(n.subs))
	for _, s := range n.subs {
		s.unready()
		s.ps = n.ps
		channels = append(channels, s.channel)
	}
	n.send(psOp{ps: old, kind: opClose})
	if len(channels) > 0 {
		n.send(psOp{ps: n.ps, kind: opSubscribe, channels: channels})
	}
	first := ""
	if len(channels) > 0 {
		first = channels[0]
	}
	go n.receive(n.ps, first)
	n.mu.Unlock()
	n.lost()
}

// confirmed marks a subscription confirmed and wakes its waiters (through
// ready), which may have missed a message while it was not.
func (n *notifier) confirmed(ps *goredis.PubSub, channel string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if s := n.subs[channel]; s != nil && s.ps == ps && !s.isReady {
		s.isReady = true
		s.gone = make(chan struct{})
		close(s.ready)
	}
}

// deliver wakes the waiter the message names, if it waits here, or one
// waiter without a name. A message that hands a lock to a waiter is
// '=<grant>\n<waiter>' (see release.lua): the waiter is given the grant.
func (n *notifier) deliver(ps *goredis.PubSub, channel, next string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.subs[channel]
	if s == nil || s.ps != ps {
		return
	}
	// A message that names a waiter wakes that waiter only, in the one
	// process where it waits: the others go on sleeping, which is what
	// keeps a release from costing an attempt per process.
	if next != "" {
		var grant string
		if strings.HasPrefix(next, "=") {
			grant, next, _ = strings.Cut(next[1:], "\n")
		}
		if c := s.named[next]; c != nil {
			if grant != "" {
				// A grant replaces a wake-up the waiter has not taken.
				select {
				case <-c:
				default:
				}
			}
			select {
			case c <- grant:
			default:
			}
		}
		return
	}
	select {
	case s.any <- "":
	default:
	}
}
