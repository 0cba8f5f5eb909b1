import json, glob, sys
for f in sorted(glob.glob(sys.argv[1] + '/*/tp_block-ws1-*.json')):
    d = json.load(open(f))
    for r in d['rows']:
        print(f.split('/')[-2], r['case'], r['mode'], round(r['ms_per_step'] * 1000, 1), 'busy', round(r['busy_us'], 1),
              'idle', round(r['idle_us'], 1), 'kernels', r['kernels'])
