// SPDX-License-Identifier: Apache-2.0

package disk_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/pkg/ipam"
	"github.com/podwire/podwire/pkg/ipam/disk"
)

// flockFile opens path (creating it) and takes an exclusive flock on it, as a
// reference host-local does; the returned function releases it.
func flockFile(t *testing.T, path string) func() {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	return func() { f.Close() }
}

// TestLockFileReplacedWhileWaiting: a call waiting for the lock file's flock while the
// file is removed and re-created (and the new one locked by a reference process)
// must not go ahead when the old file's holder lets go: it must wait for the holder
// of the file now at <dir>/lock.
func TestLockFileReplacedWhileWaiting(t *testing.T) {
	dataDir := t.TempDir()
	st := open(t, dataDir, disk.Options{})
	c := parse(t, dual)
	allocate(t, st, c, own("a"))
	lockPath := filepath.Join(dataDir, network, "lock")

	releaseOld := flockFile(t, lockPath) // a reference call holds the lock
	entered := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- st.Do(ctx, func(ipam.Tx) error { close(entered); return nil })
	}()
	time.Sleep(50 * time.Millisecond) // let it open the old file and wait on it
	if err := os.Remove(lockPath); err != nil {
		t.Fatal(err)
	}
	releaseNew := flockFile(t, lockPath) // a later reference call locks the new file
	releaseOld()
	select {
	case <-entered:
		t.Fatal("a call went ahead on the removed lock file while the new one is locked")
	case <-time.After(200 * time.Millisecond):
	}
	releaseNew()
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the call did not go ahead after the new lock file was released")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestLockFileRemovedDuringTransaction: removing the lock file while a podwire call
// is inside its transaction does not let a second podwire call in.
func TestLockFileRemovedDuringTransaction(t *testing.T) {
	dataDir := t.TempDir()
	allocate(t, open(t, dataDir, disk.Options{}), parse(t, dual), own("a"))
	inside, leave := make(chan struct{}), make(chan struct{})
	go open(t, dataDir, disk.Options{}).Do(ctx, func(ipam.Tx) error { close(inside); <-leave; return nil })
	<-inside
	if err := os.Remove(filepath.Join(dataDir, network, "lock")); err != nil {
		t.Fatal(err)
	}
	second := make(chan struct{})
	go open(t, dataDir, disk.Options{}).Do(ctx, func(ipam.Tx) error { close(second); return nil })
	select {
	case <-second:
		t.Fatal("a second call entered its transaction while the first was inside")
	case <-time.After(200 * time.Millisecond):
	}
	close(leave)
	select {
	case <-second:
	case <-time.After(5 * time.Second):
		t.Fatal("the second call did not go ahead after the first finished")
	}
}

// TestConcurrentWithLockFileRemoved: calls on separate Store values (separate
// descriptors, as separate processes have) doing ADD, repeated ADD and DEL at random
// while the lock file keeps being removed: a repeated ADD returns the first ADD's
// address, no address is handed out while a live attachment holds it, every lease
// file names its holder, and DEL of everything leaves no lease.
func TestConcurrentWithLockFileRemoved(t *testing.T) {
	dataDir := t.TempDir()
	c := parse(t, `{"ranges":[[{"subnet":"10.0.0.0/26"}]]}`)
	allocate(t, open(t, dataDir, disk.Options{}), c, own("first")) // creates the directory
	lockPath := filepath.Join(dataDir, network, "lock")
	const attachments, workers, ops = 40, 8, 2000
	var (
		mu       sync.Mutex
		ip       = map[string]string{}                    // live attachment -> address
		holder   = map[string]string{"10.0.0.2": "first"} // address -> live attachment
		locks    [attachments]sync.Mutex
		failures []string
	)
	fail := func(format string, a ...any) {
		failures = append(failures, fmt.Sprintf(format, a...))
	}
	stop := make(chan struct{})
	removerDone := make(chan struct{})
	removed := 0
	go func() {
		defer close(removerDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if os.Remove(lockPath) == nil {
				removed++
			}
			time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
		}
	}()
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < ops/workers; k++ {
				i := rand.IntN(attachments)
				id := fmt.Sprintf("c%02d", i)
				locks[i].Lock()
				st := open(t, dataDir, disk.Options{})
				mu.Lock()
				was, live := ip[id]
				mu.Unlock()
				if live && rand.IntN(3) == 0 {
					mu.Lock()
					delete(ip, id)
					delete(holder, was)
					mu.Unlock()
					if err := ipam.Release(ctx, st, own(id)); err != nil {
						mu.Lock()
						fail("DEL %s: %v", id, err)
						mu.Unlock()
					}
				} else {
					a, err := ipam.Allocate(ctx, st, c, own(id))
					mu.Lock()
					switch {
					case err != nil:
						fail("ADD %s: %v", id, err)
					case live && a[0].Address.IP.String() != was:
						fail("repeated ADD %s got %s, its first ADD %s", id, a[0].Address.IP, was)
					case !live:
						got := a[0].Address.IP.String()
						if other, held := holder[got]; held {
							fail("ADD %s got %s, which live %s holds", id, got, other)
						}
						ip[id], holder[got] = got, id
					}
					mu.Unlock()
				}
				locks[i].Unlock()
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-removerDone
	if removed < 10 {
		t.Fatalf("the lock file was removed only %d times", removed)
	}
	dir := filepath.Join(dataDir, network)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if !strings.Contains(e.Name(), ".") || strings.HasPrefix(e.Name(), "last_") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		want := holder[e.Name()]
		if string(b) != want+"\r\neth0" {
			fail("lease %s holds %q; the live attachment holding it is %q", e.Name(), b, want)
		}
	}
	st := open(t, dataDir, disk.Options{})
	for i := 0; i < attachments; i++ {
		if err := ipam.Release(ctx, st, own(fmt.Sprintf("c%02d", i))); err != nil {
			fail("final DEL: %v", err)
		}
	}
	if err := ipam.Release(ctx, st, own("first")); err != nil {
		fail("final DEL: %v", err)
	}
	if got := files(t, dir); strings.Contains(got, "eth0") {
		fail("leases left after DEL of everything:\n%s", got)
	}
	if len(failures) > 0 {
		sort.Strings(failures)
		t.Fatalf("lock file removed %d times; %d failures:\n%s", removed, len(failures), strings.Join(failures[:min(len(failures), 30)], "\n"))
	}
	t.Logf("%d calls; the lock file was removed %d times", ops, removed)
}
