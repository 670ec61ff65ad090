package redislock

import (
	_ "embed"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/internal/redisstate"
)

// The scripts are sent by digest (EVALSHA) and only in full when the server
// answers NOSCRIPT, which go-redis's Script.Run does for us.
var (
	//go:embed acquire.lua
	acquireSrc string
	//go:embed fair_acquire.lua
	fairAcquireSrc string
	// releaseHeadSrc is the start of the release, which the rest
	// (releaseSrc) and its helpers follow.
	//go:embed release_head.lua
	releaseHeadSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed refresh.lua
	refreshSrc string
	//go:embed refresh_lock.lua
	refreshLockSrc string
	//go:embed refresh_locks.lua
	refreshLocksSrc string
	//go:embed dequeue.lua
	dequeueSrc string
	//go:embed read_acquire.lua
	readAcquireSrc string
	//go:embed write_acquire.lua
	writeAcquireSrc string
	//go:embed write_release.lua
	writeReleaseSrc string
	//go:embed unwait.lua
	unwaitSrc string
	//go:embed sem_acquire.lua
	semAcquireSrc string
	//go:embed zrelease.lua
	zreleaseSrc string
	//go:embed zrefresh.lua
	zrefreshSrc string
	//go:embed inspect.lua
	inspectSrc string
	//go:embed force_release.lua
	forceReleaseSrc string
	// tokenSrc defines next_token for the scripts that grant a read or
	// write lock or a permit.
	//go:embed token.lua
	tokenSrc string
	// memberSrc defines add_member for the scripts that write a member of
	// a sorted set: a reader, a permit, a writer's wait.
	//go:embed member.lua
	memberSrc string
	// lockStateSrc defines how the scripts of plain and fair locks read and
	// write a lock's state.
	//go:embed state.lua
	lockStateSrc string
	// nextWaiterSrc defines next_waiter and wake for the scripts that free
	// a lock or tell a waiter its turn has come.
	//go:embed next_waiter.lua
	nextWaiterSrc string
	//go:embed unwait_mutex.lua
	unwaitMutexSrc string
	//go:embed rewait.lua
	rewaitSrc string
)

// scripts holds the parsed scripts. It lives in the Locker rather than in
// package variables, so that the package keeps no mutable state.
type scripts struct {
	acquire, fairAcquire, release, refresh, dequeue *goredis.Script
	refreshLock, refreshLocks                       *goredis.Script
	readAcquire, writeAcquire, writeRelease, unwait *goredis.Script
	semAcquire, zrelease, zrefresh                  *goredis.Script
	inspect, forceRelease, unwaitMutex              *goredis.Script
	// The digests and bodies of the scripts on every plain lock's path, as
	// interface values for scripter.evalsha, converted once.
	acquireSha, acquireSrc, releaseSha, releaseSrc, rewaitSha, rewaitSrc any
	// forceReleaseBody is forceRelease's body, which ForceRelease sends
	// once (scripter.evalshaOnce) on NOSCRIPT.
	forceReleaseBody string
}

func newScripts() *scripts {
	stateSrc := redisstate.Lua + lockStateSrc
	s := &scripts{
		acquire:      goredis.NewScript(acquireSrc),
		fairAcquire:  goredis.NewScript(stateSrc + nextWaiterSrc + fairAcquireSrc),
		release:      goredis.NewScript(releaseHeadSrc + nextWaiterSrc + releaseSrc),
		refresh:      goredis.NewScript(refreshSrc),
		refreshLock:  goredis.NewScript(refreshLockSrc),
		refreshLocks: goredis.NewScript(refreshLocksSrc),
		dequeue:      goredis.NewScript(stateSrc + nextWaiterSrc + dequeueSrc),
		readAcquire:  goredis.NewScript(tokenSrc + memberSrc + readAcquireSrc),
		writeAcquire: goredis.NewScript(tokenSrc + memberSrc + writeAcquireSrc),
		writeRelease: goredis.NewScript(writeReleaseSrc),
		unwait:       goredis.NewScript(unwaitSrc),
		semAcquire:   goredis.NewScript(tokenSrc + memberSrc + semAcquireSrc),
		zrelease:     goredis.NewScript(zreleaseSrc),
		zrefresh:     goredis.NewScript(memberSrc + zrefreshSrc),
		inspect:      goredis.NewScript(stateSrc + inspectSrc),
		forceRelease: goredis.NewScript(stateSrc + nextWaiterSrc + forceReleaseSrc),
		unwaitMutex:  goredis.NewScript(stateSrc + nextWaiterSrc + unwaitMutexSrc),
	}
	s.acquireSha, s.acquireSrc = s.acquire.Hash(), acquireSrc
	s.releaseSha, s.releaseSrc = s.release.Hash(), releaseHeadSrc+nextWaiterSrc+releaseSrc
	s.rewaitSha, s.rewaitSrc = goredis.NewScript(rewaitSrc).Hash(), rewaitSrc
	s.forceReleaseBody = stateSrc + nextWaiterSrc + forceReleaseSrc
	return s
}
