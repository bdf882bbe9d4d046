package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/han-app/gateway/internal/config"
	"github.com/han-app/gateway/store/rds"
)

// cmdRedisACL renders the ACL file. The api_backend password comes from
// HAN_REDIS_API_PASSWORD or, failing that, from REDIS_URL's userinfo;
// whether DB0 and DB1 share an instance is read from the two URLs unless
// --separate-instances says so. --cluster (or a cluster URL in REDIS_URL or
// REDIS_REALTIME_URL) renders the file every node of a Redis Cluster loads.
// --admin-user adds an administrator (password from the environment, never
// a flag: a flag shows in the process list). With --out, the users of the
// file replaced that hanctl does not render (an admin, a monitoring user)
// are kept as they are, and a user of that file the new one would drop is
// refused unless --force.
func cmdRedisACL(args []string, getenv func(string) string, out io.Writer) error {
	fs := flag.NewFlagSet("redis acl", flag.ContinueOnError)
	separate := fs.Bool("separate-instances", false, "DB0 and DB1 are separate instances: deny SELECT")
	cluster := fs.Bool("cluster", false, "render the ACL of a Redis Cluster node (load it on every node)")
	outFile := fs.String("out", "", "write to FILE (mode 0600) instead of stdout, keeping the users of FILE hanctl does not render")
	admin := fs.String("admin-user", "", "also render the admin user NAME (all commands, keys and channels); password from HAN_REDIS_ADMIN_PASSWORD")
	force := fs.Bool("force", false, "with --out: write even if a user of FILE (legacy_stub) would be dropped, or FILE has a line that is not a user")
	if err := parseFlags(fs, args, out); err != nil {
		return err
	}
	o, err := aclOptions(getenv, *separate, *cluster)
	if err != nil {
		return err
	}
	if *admin != "" {
		if o.AdminUser, o.AdminPassword, err = aclAdmin(*admin, getenv); err != nil {
			return err
		}
	}
	if *outFile == "" {
		_, err := io.WriteString(out, rds.RenderACL(o))
		return err
	}
	kept, err := keepUsers(*outFile, o, *force)
	if err != nil {
		return err
	}
	for _, u := range kept {
		o.Extra = append(o.Extra, u.Line)
	}
	if err := writePrivate(*outFile, []byte(rds.RenderACL(o))); err != nil {
		return err
	}
	fmt.Fprintf(out, "%s: %s\n", *outFile, describeACL(o, kept))
	return nil
}

// aclOptions reads what the rendered users need from the environment.
func aclOptions(getenv func(string) string, separate, cluster bool) (rds.ACLOptions, error) {
	if rds.IsClusterURL(getenv("REDIS_URL")) || rds.IsClusterURL(getenv("REDIS_REALTIME_URL")) {
		cluster = true
	}
	pw := getenv("HAN_REDIS_API_PASSWORD")
	if pw == "" && getenv("REDIS_URL") != "" {
		if u, err := url.Parse(getenv("REDIS_URL")); err == nil && u.User != nil {
			pw, _ = u.User.Password()
		}
	}
	if pw == "" {
		return rds.ACLOptions{}, errors.New("set HAN_REDIS_API_PASSWORD (or a password in REDIS_URL)")
	}
	if !separate && getenv("REDIS_URL") != "" && getenv("REDIS_REALTIME_URL") != "" {
		separate = !config.SameRedisInstance(getenv("REDIS_URL"), getenv("REDIS_REALTIME_URL"))
	}
	return rds.ACLOptions{APIBackendPassword: pw, SeparateInstances: separate, Cluster: cluster,
		LegacyStubPassword: getenv("HAN_LEGACY_STUB_PASSWORD")}, nil
}

// aclAdmin checks the --admin-user name and finds its password:
// HAN_REDIS_ADMIN_PASSWORD, else the password of HAN_REDIS_ADMIN_URL when
// that URL's user is the same name.
func aclAdmin(name string, getenv func(string) string) (string, string, error) {
	if strings.ContainsFunc(name, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return "", "", errors.New("--admin-user: a user name has no spaces or control characters")
	}
	if slices.Contains(rds.ACLOptions{}.OwnedUsers(), name) {
		return "", "", fmt.Errorf("--admin-user: %s is a user hanctl renders with its own rules; name another", name)
	}
	if pw := getenv("HAN_REDIS_ADMIN_PASSWORD"); pw != "" {
		return name, pw, nil
	}
	if u, err := url.Parse(getenv("HAN_REDIS_ADMIN_URL")); err == nil && u.User != nil && u.User.Username() == name {
		if pw, _ := u.User.Password(); pw != "" {
			return name, pw, nil
		}
	}
	return "", "", fmt.Errorf("--admin-user %s: set HAN_REDIS_ADMIN_PASSWORD (or HAN_REDIS_ADMIN_URL with user %s and its password)", name, name)
}

// keepUsers reads the ACL file about to be replaced and returns its users
// that o does not render, to be written again as they are. A user of the
// file that the new one would not have (legacy_stub rendered without its
// password) and a line that is not a user line are refused unless force;
// a file not there yet has nothing to keep.
func keepUsers(file string, o rds.ACLOptions, force bool) ([]rds.ACLFileUser, error) {
	data, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the users of %s, to keep them: %w", file, err)
	}
	users, err := rds.ParseACLFile(string(data))
	if err != nil {
		if !force {
			return nil, fmt.Errorf("%s: %v; Redis does not load such a file: fix it, or add --force to write the file anew "+
				"(its users hanctl does not render are lost)", file, err)
		}
		return nil, nil
	}
	var kept []rds.ACLFileUser
	var dropped []string
	for _, u := range users {
		switch {
		case !slices.Contains(o.OwnedUsers(), u.Name):
			kept = append(kept, u)
		case u.Name == rds.LegacyStubUser && o.LegacyStubPassword == "":
			dropped = append(dropped, u.Name)
		}
	}
	if len(dropped) > 0 && !force {
		return nil, fmt.Errorf("%s has user %s, which this file would drop (set HAN_LEGACY_STUB_PASSWORD to keep it); "+
			"nothing written: add --force to drop it", file, strings.Join(dropped, ", "))
	}
	return kept, nil
}

// describeACL lists the users of a written file: rendered, then kept.
func describeACL(o rds.ACLOptions, kept []rds.ACLFileUser) string {
	users := []string{"default (off)", rds.APIBackendUser}
	if o.LegacyStubPassword != "" {
		users = append(users, rds.LegacyStubUser)
	}
	if o.AdminUser != "" {
		users = append(users, o.AdminUser+" (admin)")
	}
	s := "users " + strings.Join(users, ", ")
	if len(kept) > 0 {
		names := make([]string, len(kept))
		for i, u := range kept {
			names[i] = u.Name
		}
		s += "; kept from the file replaced: " + strings.Join(names, ", ")
	}
	return s
}
