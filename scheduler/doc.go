// Package scheduler runs cron jobs once per scheduled slot across a cluster
// of processes, each job under a distributed lock from guard.
//
// A Scheduler sits on robfig/cron/v3: its spec parser (with an optional
// seconds field and the @descriptors), its time zone and its timer loop.
// Every process of the cluster adds the same jobs; at each fire time every
// process tries to run the job, and exactly one does:
//
//  1. The slot is named: the job name plus the scheduled fire time, the
//     same on every node. Cron specs are wall-clock aligned already; @every
//     schedules are aligned here to an anchor (the Unix epoch by default),
//     because robfig/cron counts them from when each node added the job.
//  2. The slot is claimed in an idempotency.Store (WithSlotStore). A slot
//     claimed or completed elsewhere is skipped, whatever the clocks say:
//     this is what keeps a short job from running twice when one node's
//     clock or timer is a little behind, the failure users of ShedLock,
//     gocron and dcron keep reporting.
//  3. The job's lock (named after the job) is taken, by default without
//     waiting: a run that finds it held is skipped. WaitForLock waits up to
//     a bound instead. The lock keeps runs of the same job from overlapping.
//     A lock taken a third of the claim's lease or more after the claim
//     was sent (a paused process, a long wait) is followed by an
//     owner-checked renewal of the claim: a claim that lapsed meanwhile
//     may have been caught up, run and completed elsewhere, and the slot
//     is skipped.
//  4. The job runs with a context that is cancelled when the lock is lost
//     (cause guard.ErrLockLost), at LockAtMostFor (cause ErrLockAtMostFor)
//     and on Stop (cause ErrStopped), and that carries the run (RunFrom):
//     the slot, the instance and the lock with its fencing token.
//  5. The slot claim is completed. A failed slot is not retried by default;
//     RetryFailedSlots lets another node (or a later timer) run it again.
//     A claim whose answer was lost (Stop cut the call short, the
//     connection broke) is given back, in case it landed. A slot whose
//     runner died mid-run stays claimed until the claim lapses; with
//     CatchUp another node watches the claim and runs the slot again, with
//     a fresh fencing token, while the slot is younger than MisfireAfter;
//     a run that Stop cut short gives its claim back for the same.
//  6. The lock is kept until LockAtLeastFor has passed since it was taken,
//     then released.
//
// Every run ends in one outcome, recorded on a span, in metrics, in the log
// and to the RunObserver: ran, skipped, failed, lost or misfired. Nothing is
// dropped silently: slots the timer never fired, because it ran an interval
// or more late (a stalled process, a suspended machine, a clock stepped
// forward), are recorded as misfired too, once for each such stretch, under
// its first slot.
//
// Slots are named and fired on each node's clock. The promise is once per
// slot, not on time by the store's clock: the node whose clock is fastest
// runs each slot first (20 minutes fast, every hourly slot 20 minutes
// early), and the others skip it as done. Keep the nodes' clocks
// synchronised. The slot store's contract has no clock to check them by.
//
// A node ahead by a whole number of intervals, give or take a run's length,
// leaves slots unrun: its run of a later slot and another node's run of an
// earlier one (which the fast node gave back, having found the lock held)
// start together and meet at the job's lock, and the one that finds it held
// skips its slot, as step 3 says. Skipped on the last node to fire it, a
// slot runs nowhere; every node records it skipped ("lock held"). With one
// node of three 10 minutes ahead, a minutely job of 10ms left 3 to 10 of its
// first 30 slots unrun in 60 tries, and 10 of 598 over ten hours; one 2s ahead
// left 2 of 598 slots of "@every 1s" unrun. WaitForLock, longer than a
// run, makes such a run wait for the other instead: no slot was left unrun
// in the same runs with WaitForLock(10*time.Second).
//
// Across daylight saving changes a job at fixed times of day (no '*'
// leading its seconds, minute or hour field; any descriptor but @hourly)
// keeps cron's rule: a time the clocks repeat runs once, at its first
// instant, and a time they skip runs at the change (02:30 on the day New
// York's clocks go from 02:00 to 03:00 runs at 03:00). Jobs with such a
// wildcard follow the clock, as in cron: "0 * * * *" runs at each hour the
// clock shows, 23 or 25 times that day. A slot's name is its instant, the
// same on every node. The rule is computed over robfig/cron's schedule,
// which handles whole-hour changes: in a zone whose clocks move by half an
// hour (Australia/Lord_Howe), robfig/cron skips some slots around the
// change, and so does the scheduler.
//
// Without a slot store, once per slot rests on the lock and LockAtLeastFor
// alone, as with ShedLock: it holds only while nodes' clocks and timers
// differ by less than LockAtLeastFor (DefaultLockAtLeastFor unless set) and
// the job's run plus that bound stay under the interval. Use a slot store
// in production.
//
// # Leader mode
//
// WithLeaderElection adds a gate in front of step 2: the Schedulers of the
// cluster campaign for one election (guard.Guard.Campaign), and only the
// leader goes on to claim slots and take job locks; the others skip every
// slot as "not the leader", touching neither the store nor the locks. The
// leader's term number (its lease's fencing token) is in Run and RunRecord,
// and a job's context is cancelled when the term is lost. Scheduler.Elector
// offers the same election to go-co-op/gocron/v2 (gocron.WithDistributedElector).
// A CatchUp job's followers keep its latest slots in view until they are
// MisfireAfter old (half its SlotRetention, if sooner), and the one that
// comes to lead by then runs those its leader left unfinished or that fell
// due while no node led; a slot the leader skipped for a held lock stays
// skipped (see CatchUp).
//
// Slots fall due on each node's clock, the leader's included: a new leader
// whose clock is ahead of the old one's never runs the slots between the
// two clocks, which fell due on it while it followed and were skipped
// everywhere (a new leader 10 minutes ahead: the 10 slots of a minutely job
// in between; none of a CatchUp job's with MisfireAfter(20*time.Minute)).
//
// For programs that keep their own scheduler, Scheduler.WrapSpec (or
// Wrap, which is not told the spec and names a late firing's slot wrong)
// guards a robfig/cron job and Scheduler.Locker serves as a
// go-co-op/gocron/v2 Locker: both take every run through the same path as
// a job added to the Scheduler, with the same options and defaults.
package scheduler
