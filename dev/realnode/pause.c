/* The pod sandbox's process: holds the pod's namespaces, reaps zombies, exits
 * on SIGINT/SIGTERM. The same few lines as Kubernetes' build/pause/linux/pause.c,
 * built here because there is no registry to pull registry.k8s.io/pause from. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void sigdown(int signo) { exit(0); }

static void sigreap(int signo) {
  while (waitpid(-1, NULL, WNOHANG) > 0)
    ;
}

int main(void) {
  if (getpid() != 1)
    fprintf(stderr, "Warning: pause should be the first process\n");
  struct sigaction down = {.sa_handler = sigdown};
  struct sigaction reap = {.sa_handler = sigreap, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &down, NULL) < 0 || sigaction(SIGTERM, &down, NULL) < 0 ||
      sigaction(SIGCHLD, &reap, NULL) < 0)
    return 1;
  for (;;)
    pause();
}
