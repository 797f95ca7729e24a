// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// build is one podwire build's plugins: the version they report and each file's hash.
type build struct {
	version string
	sums    map[string]string // file name -> sha256
}

// hashDir hashes every regular file of dir but dotfiles.
func hashDir(dir string) (map[string]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	sums := map[string]string{}
	for _, e := range ents {
		if !e.Type().IsRegular() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		s, err := sha256File(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		sums[e.Name()] = s
	}
	return sums, nil
}

func sha256File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

var aboutVersion = regexp.MustCompile(`\(podwire ([^ ,)]+)`)

// pluginVersion executes a plugin without CNI_COMMAND: it prints "CNI plugin NAME
// (podwire VERSION, ...)" (skel's about text). An exec error (ETXTBSY, ENOEXEC: a binary
// being written in place) is returned as it is.
func pluginVersion(path string) (string, error) {
	cmd := exec.Command(path)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("executing %s: %w: %s", path, err, out)
	}
	m := aboutVersion.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("%s printed no podwire version: %q", path, out)
	}
	return string(m[1]), nil
}

// dirSampler watches one node's /opt/cni/bin (its bind source on the machine) while the
// agents on it are replaced: every file seen under its name must hash to one of the
// builds, and every plugin executed must report one of their versions.
type dirSampler struct {
	dir    string
	builds []build

	mu       sync.Mutex
	samples  int            // directory listings
	hashed   int            // files hashed (a new inode, size or mtime)
	execs    int            // plugins executed
	seen     map[string]int // "v1", "v2", "temp" -> files seen in that state
	bad      []string       // a file of neither build, an exec that failed
	versions map[string]int // versions the executed plugins reported
	last     map[string]fileKey
	lastSum  map[string]string
}

type fileKey struct {
	ino, size uint64
	mtime     int64
}

func newDirSampler(dir string, builds ...build) *dirSampler {
	return &dirSampler{dir: dir, builds: builds, seen: map[string]int{}, versions: map[string]int{},
		last: map[string]fileKey{}, lastSum: map[string]string{}}
}

// run samples until stop is closed: the listing every 20 ms (a file is hashed again
// only when its inode, size or mtime changed: a rename brings a new inode, a write in
// place a new size or mtime), the plugins executed every second.
func (s *dirSampler) run(stop <-chan struct{}) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	nextExec := time.Now()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		s.sample(time.Now().After(nextExec))
		if time.Now().After(nextExec) {
			nextExec = time.Now().Add(time.Second)
		}
	}
}

func (s *dirSampler) classify(sum string) string {
	for i, b := range s.builds {
		for _, v := range b.sums {
			if v == sum {
				return "v" + strconv.Itoa(i+1)
			}
		}
	}
	return ""
}

func (s *dirSampler) sample(execute bool) {
	ents, err := os.ReadDir(s.dir)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samples++
	if err != nil {
		s.bad = append(s.bad, err.Error())
		return
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			s.seen["temp"]++
			continue
		}
		path := filepath.Join(s.dir, e.Name())
		var st syscall.Stat_t
		if err := syscall.Stat(path, &st); err != nil {
			continue // renamed over between the listing and the stat
		}
		k := fileKey{st.Ino, uint64(st.Size), st.Mtim.Nano()}
		if s.last[e.Name()] != k {
			sum, err := sha256File(path)
			if err != nil {
				continue
			}
			s.hashed++
			s.last[e.Name()], s.lastSum[e.Name()] = k, sum
		}
		state := s.classify(s.lastSum[e.Name()])
		if state == "" {
			s.bad = append(s.bad, fmt.Sprintf("%s: sha256 %s is neither build's", path, s.lastSum[e.Name()]))
			continue
		}
		s.seen[state]++
		if execute && e.Name() != "podwire" {
			v, err := pluginVersion(path)
			s.execs++
			if err != nil {
				s.bad = append(s.bad, err.Error())
				continue
			}
			s.versions[v]++
			ok := false
			for _, b := range s.builds {
				ok = ok || v == b.version
			}
			if !ok {
				s.bad = append(s.bad, fmt.Sprintf("%s reported version %s, neither build's", path, v))
			}
		}
	}
}

// summary is one line for the report.
func (s *dirSampler) summary() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var vs []string
	for v, n := range s.versions {
		vs = append(vs, fmt.Sprintf("%s ×%d", v, n))
	}
	sort.Strings(vs)
	return fmt.Sprintf("%d listings, %d files hashed (v1 %d, v2 %d file-samples, %d temporary-file sightings), %d plugin executions (%s), %d bad",
		s.samples, s.hashed, s.seen["v1"], s.seen["v2"], s.seen["temp"], s.execs, strings.Join(vs, ", "), len(s.bad))
}

// dirState is what a bin dir holds now: each plugin's build ("v1", "v2" or its hash),
// and its temporary files.
func dirState(dir string, builds ...build) (map[string]string, []string, error) {
	sums, err := hashDir(dir)
	if err != nil {
		return nil, nil, err
	}
	s := &dirSampler{builds: builds}
	state := map[string]string{}
	for name, sum := range sums {
		if state[name] = s.classify(sum); state[name] == "" {
			state[name] = sum
		}
	}
	ents, _ := os.ReadDir(dir)
	var temps []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			temps = append(temps, e.Name())
		}
	}
	return state, temps, nil
}

// agentPids are the podwire-agent processes in the network namespace netns (the agent
// runs with hostNetwork: the node's).
func agentPids(netns string) map[int]bool {
	var want syscall.Stat_t
	if syscall.Stat(netns, &want) != nil {
		return nil
	}
	out := map[int]bool{}
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil || strings.TrimSpace(string(comm)) != "podwire-agent" {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st) == nil && st.Ino == want.Ino && st.Dev == want.Dev {
			out[pid] = true
		}
	}
	return out
}

// killMidInstall SIGKILLs the first new podwire-agent on netns (one not in old) at the
// moment a temporary file shows in binDir, its install's copy under way; it gives up at
// stop or after d. It returns the killed pid and how long after the sighting. The new
// agent's pid is looked up every 10 ms before (a /proc scan takes milliseconds, a copy
// not many more), so the kill follows the sighting at once.
func killMidInstall(netns, binDir string, old map[int]bool, d time.Duration, stop <-chan struct{}) (int, time.Duration, error) {
	deadline := time.Now().Add(d)
	pid, scanned := 0, time.Time{}
	for time.Now().Before(deadline) {
		select {
		case <-stop:
			return 0, 0, fmt.Errorf("stopped")
		default:
		}
		if time.Since(scanned) > 10*time.Millisecond {
			pid, scanned = 0, time.Now()
			for p := range agentPids(netns) {
				if !old[p] {
					pid = p
				}
			}
		}
		ents, err := os.ReadDir(binDir)
		if err != nil {
			return 0, 0, err
		}
		temp := false
		for _, e := range ents {
			temp = temp || strings.HasPrefix(e.Name(), ".")
		}
		if !temp || pid == 0 {
			time.Sleep(200 * time.Microsecond)
			continue
		}
		seen := time.Now()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			return 0, 0, fmt.Errorf("SIGKILL %d: %w", pid, err)
		}
		return pid, time.Since(seen), nil
	}
	return 0, 0, fmt.Errorf("no new agent copied a plugin in %s within %s", binDir, d)
}
