package netfilter

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func requireNFTIPTables(t testing.TB, fam Family) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	bin, restore := binaries(fam)
	path, err := exec.LookPath(restore)
	if err != nil {
		t.Skipf("%s is not installed", restore)
	}
	if out, err := exec.Command(bin, "--version").Output(); err != nil || !strings.Contains(string(out), "nf_tables") {
		t.Skipf("%s is not iptables-nft: %s", bin, out)
	}
	return path
}

// The installed iptables-nft stores, for every rule shape podwire writes, exactly what
// the direct path stores, and lists it as the direct path does.
func TestXTSelfCheck(t *testing.T) {
	for _, fam := range []Family{IPv4, IPv6} {
		restore := requireNFTIPTables(t, fam)
		if err := xtSelfCheck(fam, restore); err != nil {
			t.Errorf("%s: %v", fam, err)
		}
	}
}

// The self-check fails where iptables does something else: here a wrapper that makes
// it write other ports, and iptables-legacy, which writes nothing to nf_tables.
func TestXTSelfCheckCatchesDifferences(t *testing.T) {
	restore := requireNFTIPTables(t, IPv4)
	dir := t.TempDir()
	wrapper := filepath.Join(dir, "iptables-restore")
	script := "#!/bin/sh\nsed 's/8080/8081/' | " + restore + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := xtSelfCheck(IPv4, wrapper); err == nil {
		t.Error("the self-check passed an iptables-restore that writes other rules")
	}
	if legacy, err := exec.LookPath("iptables-legacy-restore"); err == nil {
		if err := xtSelfCheck(IPv4, legacy); err == nil {
			t.Error("the self-check passed iptables-legacy")
		}
	}
}

// Restore scripts are atomic: a script with a line that fails changes nothing; -D
// removes exactly the rule named; declaring an existing chain flushes it.
func TestXTDirectRestore(t *testing.T) {
	requireNFTIPTables(t, IPv4)
	out, err := inScratchNetns(func() ([]string, error) {
		d := &xtDirect{fam: IPv4}
		defer d.drop()
		var log []string
		step := func(script string) {
			err := d.restore("*nat\n" + script + "\nCOMMIT\n")
			l, _ := d.list("nat", "PW-T")
			log = append(log, "err="+errText(err)+"\n"+l)
		}
		step(":PW-T - [0:0]\n-A PW-T -p tcp -m tcp --dport 1 -j RETURN\n-A PW-T -p tcp -m tcp --dport 2 -j RETURN\n-A PREROUTING -j PW-T")
		step("-D PW-T -p tcp -m tcp --dport 9 -j RETURN\n-A PW-T -p tcp -m tcp --dport 3 -j RETURN")
		if err := d.restore("*nat\n-A PW-T -j RETURN\n-D PW-T -j RETURN\nCOMMIT\n"); !errors.Is(err, errXTUnsupported) {
			log = append(log, "a -D after an -A in the same chain: "+errText(err))
		}
		step("-D PW-T -p tcp -m tcp --dport 1 -j RETURN\n-I PW-T 1 -p udp -m udp --dport 4 -j RETURN")
		step("-A PW-T -j NO-SUCH-CHAIN")
		step(":PW-T - [0:0]\n-A PW-T -j ACCEPT")
		// -X of a chain that still has rules fails, as in iptables.
		if err := d.restore("*nat\n-X PW-T\nCOMMIT\n"); err == nil {
			log = append(log, "-X deleted a chain that has rules")
		}
		return log, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"err=\n-N PW-T\n-A PW-T -p tcp -m tcp --dport 1 -j RETURN\n-A PW-T -p tcp -m tcp --dport 2 -j RETURN\n",
		"err=line 2: no rule \"-p tcp -m tcp --dport 9 -j RETURN\" in chain PW-T (does a matching rule exist in that chain?)\n-N PW-T\n-A PW-T -p tcp -m tcp --dport 1 -j RETURN\n-A PW-T -p tcp -m tcp --dport 2 -j RETURN\n",
		"err=\n-N PW-T\n-A PW-T -p udp -m udp --dport 4 -j RETURN\n-A PW-T -p tcp -m tcp --dport 2 -j RETURN\n",
		"err=line 2: chain 'NO-SUCH-CHAIN' does not exist\n-N PW-T\n-A PW-T -p udp -m udp --dport 4 -j RETURN\n-A PW-T -p tcp -m tcp --dport 2 -j RETURN\n",
		"err=\n-N PW-T\n-A PW-T -j ACCEPT\n",
	}
	if len(out) != len(want) {
		t.Errorf("%d results, want %d: %q", len(out), len(want), out)
	}
	for i := range want {
		if i >= len(out) || out[i] != want[i] {
			t.Errorf("step %d:\n%s\nwant\n%s", i+1, out[min(i, len(out)-1)], want[i])
		}
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
