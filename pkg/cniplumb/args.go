package cniplumb

import (
	"strings"
)

// ParseArgs splits CNI_ARGS ("K1=V1;K2=V2") into a map. An entry without "=" is a
// code-4 error naming it. Empty input gives an empty map.
func ParseArgs(s string) (map[string]string, error) {
	out := map[string]string{}
	if s == "" {
		return out, nil
	}
	for _, kv := range strings.Split(s, ";") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, EnvError("CNI_ARGS", "entry %q is not KEY=VALUE; CNI_ARGS is a ';'-separated list of KEY=VALUE pairs", kv)
		}
		out[k] = v
	}
	return out, nil
}
